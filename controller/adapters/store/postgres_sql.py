"""Every SQL statement of the PostgreSQL store's operations (its tables and migrations: `postgres_schema`).

Name lists travel as ONE array parameter (`= ANY(%s::text[])`), so a pass costs the same few statements
whatever the number of names. Ids are never cast on our side: `id = %s` lets the server read the
parameter as the column's type (uuid in Supabase, text in some lab copies), and the family statements
join ids inside the database so they never cross the wire at all. Row columns are read as text and
decoded by `codec`, so one odd value (an `infinity` timestamp, a double-encoded document) makes that row
undecodable instead of failing the whole read.
"""

from __future__ import annotations

from collections.abc import Collection

# Arbitrary but fixed keys of advisory locks (pg_advisory_xact_lock(key)), as schema setup's: the
# look-up-or-register of model and benchmark rows (models.name is not unique, so only a lock keeps two
# writers from registering the same new model twice), and the recording of an EvalRun's transitions.
REGISTRY_LOCK = 0x65766C72756E0002
NOTIFY_LOCK = 0x6E6F7469  # ('noti'; an int4) with the EvalRun's name hashed: one recording of its transitions at a time


# --------------------------------------------------------------------------- observe

# Canonical ids of the named models/benchmarks (a duplicate leads to its canonical row), then each family:
# the canonical rows and every row that says it duplicates one. `all_*` = every row (`db check`).
_FAMILY_CTES = """
  model_canon AS (
    SELECT COALESCE(duplicate_of, id) AS id FROM models
     WHERE %(all_models)s OR name = ANY(%(models)s::text[])
  ),
  model_family AS (
    SELECT id, name, duplicate_of FROM models
     WHERE id IN (SELECT id FROM model_canon) OR duplicate_of IN (SELECT id FROM model_canon)
  ),
  bench_canon AS (
    SELECT COALESCE(duplicate_of, id) AS id FROM benchmarks
     WHERE %(all_benchmarks)s OR name = ANY(%(benchmarks)s::text[])
  ),
  bench_family AS (
    SELECT id, name, duplicate_of FROM benchmarks
     WHERE id IN (SELECT id FROM bench_canon) OR duplicate_of IN (SELECT id FROM bench_canon)
  )"""

# kind, id, name, duplicate_of: both families in one statement.
FAMILIES = f"""
WITH {_FAMILY_CTES}
SELECT 'model' AS kind, id::text, name, duplicate_of::text FROM model_family
UNION ALL
SELECT 'benchmark', id::text, name, duplicate_of::text FROM bench_family
ORDER BY 1, 2
"""

ROW_COLUMNS = (
    "id::text AS id, job_name, username, job_status, created_at::text AS created_at,"
    " submitted_at::text AS submitted_at, started_at::text AS started_at, ended_at::text AS ended_at,"
    " slurm_job_id::text AS slurm_job_id, model_id::text AS model_id, benchmark_id::text AS benchmark_id,"
    " config::text AS config, metrics::text AS metrics, is_overlong, n_rep_eval"
)

# The same families, recomputed in the database: ids never make the round trip through the client.
ROWS_IN_FAMILIES = f"""
WITH {_FAMILY_CTES}
SELECT {ROW_COLUMNS} FROM sandbox_jobs
 WHERE (%(all_models)s OR model_id IN (SELECT id FROM model_family))
   AND (%(all_benchmarks)s OR benchmark_id IN (SELECT id FROM bench_family))
 ORDER BY sandbox_jobs.id
"""

ROW_BY_ID = f"SELECT {ROW_COLUMNS} FROM sandbox_jobs WHERE id = %s"

SUBMISSION_FIELDS = ("name", "run_tag", "evalrun", "cell_key", "attempt", "fire", "row_id", "job_id", "created_at",
                     "model", "benchmark", "gpu_hours", "cluster", "estimated_hours", "elapsed_hours", "trials",
                     "concurrency")
SUBMISSION_COLUMNS = ", ".join(SUBMISSION_FIELDS)
GPU_HISTORY_COLUMNS = frozenset(("model", "benchmark", "gpu_hours", "finished_at"))


def submission_columns(lacking: Collection[str] = ()) -> str:
    """The record's columns but those `lacking`: a read-only store reads a database that later migrations have not
    reached as it is, its records without what they add."""
    return ", ".join(field for field in (*SUBMISSION_FIELDS, "finished_at") if field not in lacking)


SUBMISSIONS_OF = """
SELECT {columns} FROM evalrun_submissions
 WHERE evalrun = %(evalrun)s OR cell_key = ANY(%(cell_keys)s::text[])
 ORDER BY created_at, name
"""
# every EvalRun's (`evalctl get`)
EVERY_SUBMISSION = "SELECT {columns} FROM evalrun_submissions ORDER BY created_at, name"
EVERY_MEMORY = "SELECT cell_key, memory FROM evalrun_cell_memory"


# Finished attempts of the named benchmarks whose every job's GPU-hours are recorded, newest first.
GPU_HISTORY_OF = """
SELECT run_tag, min(model) AS model, min(benchmark) AS benchmark, sum(gpu_hours) AS gpu_hours, {wall} AS wall_hours,
       {size}
  FROM evalrun_submissions
 WHERE finished_at IS NOT NULL AND benchmark = ANY(%(benchmarks)s::text[])
 GROUP BY run_tag
HAVING count(gpu_hours) = count(*) AND min(model) IS NOT NULL
 ORDER BY max(finished_at) DESC, run_tag
 LIMIT %(history_max)s
"""


def gpu_history(lacking: Collection[str]) -> str:
    """The history of a database later migrations may not have reached (their columns read as NULL): an attempt's
    wall time, its jobs' elapsed hours summed when every one of them is recorded (0010); the trials it was to run
    and at what concurrency (0011)."""
    wall = "NULL" if "elapsed_hours" in lacking else \
        "CASE WHEN count(elapsed_hours) = count(*) THEN sum(elapsed_hours) END"
    size = "NULL::integer AS trials, NULL::integer AS concurrency" if "trials" in lacking else \
        "max(trials) AS trials, max(concurrency) AS concurrency"
    return GPU_HISTORY_OF.format(wall=wall, size=size)

# Claims renewed within the TTL by the database's clock.
LIVE_OWNERS_OF_CELLS = """
SELECT cell_key, evalrun, renewed_at FROM evalrun_cell_owners
 WHERE cell_key = ANY(%(cell_keys)s::text[])
   AND renewed_at >= now() - make_interval(secs => %(owner_ttl_s)s::float8)
 ORDER BY cell_key
"""

TUNNEL_LEASES = "SELECT pair, holder, evalrun, leased_at FROM evalrun_tunnel_leases ORDER BY pair"

MEMORY_OF_CELLS = "SELECT cell_key, memory FROM evalrun_cell_memory WHERE cell_key = ANY(%(cell_keys)s::text[])"

# Every quarantine still in force by the database's clock (the table is small: no filter by EvalRun).
LIVE_QUARANTINES = """
SELECT kind, scope, name, reason, until, since, owner FROM evalrun_quarantine
 WHERE until > now() AND released_at IS NULL ORDER BY kind, scope, name
"""
# a read-only store on a database migration 0007 has not reached: nothing was released there
LEGACY_LIVE_QUARANTINES = """
SELECT kind, scope, name, reason, until FROM evalrun_quarantine WHERE until > now() ORDER BY kind, scope, name
"""

# The canonical models (a duplicate is another name of one of them), for a modelSelector. creation_time as text,
# decoded by codec like every other time: a lab copy whose column is text sorts and filters the same way.
REGISTERED_MODELS = "SELECT name, creation_time::text AS creation_time FROM models WHERE duplicate_of IS NULL"

MODEL_SELECTIONS = """
SELECT model, rule, selected_at FROM evalrun_model_selections WHERE evalrun = %s ORDER BY selected_at, model
"""

# --------------------------------------------------------------------------- results DB writes

# Look the model up (legacy data has several rows per name: the order is codec.registry_order's, the ids
# compared as text in byte order whether they are uuid or text), register it if new, same for the benchmark,
# then insert the row unless its id exists. One statement, run under REGISTRY_LOCK; the sibling CTE's inserts
# are visible to the foreign-key checks at the end of the statement.
CREATE_ROW = """
WITH
  found_model AS (
    SELECT id FROM models WHERE name = %(model_name)s::text
     ORDER BY duplicate_of IS NOT NULL, creation_time NULLS LAST, id::text COLLATE "C" LIMIT 1
  ),
  new_model AS (
    INSERT INTO models (id, name, created_by, creation_time)
    SELECT %(new_model_id)s, %(model_name)s::text, %(username)s::text, now()
     WHERE NOT EXISTS (SELECT 1 FROM found_model)
    RETURNING id
  ),
  found_benchmark AS (
    SELECT id FROM benchmarks WHERE name = %(benchmark_name)s::text
     ORDER BY duplicate_of IS NOT NULL, id::text COLLATE "C" LIMIT 1
  ),
  new_benchmark AS (
    INSERT INTO benchmarks (id, name)
    SELECT %(new_benchmark_id)s, %(benchmark_name)s::text
     WHERE NOT EXISTS (SELECT 1 FROM found_benchmark)
    RETURNING id
  )
INSERT INTO sandbox_jobs (
    id, created_at, job_name, username, submitted_at, started_at, n_trials, n_rep_eval,
    config, model_id, benchmark_id, job_status, slurm_job_id, is_overlong
)
SELECT %(id)s, now(), %(job_name)s::text, %(username)s::text, %(submitted_at)s::timestamptz,
       %(started_at)s::timestamptz, %(n_trials)s::integer, %(n_rep_eval)s::integer, %(config)s,
       (SELECT id FROM found_model UNION ALL SELECT id FROM new_model),
       (SELECT id FROM found_benchmark UNION ALL SELECT id FROM new_benchmark),
       %(job_status)s::text, %(slurm_job_id)s::text, false
    ON CONFLICT (id) DO NOTHING
"""

# Ours only, and never backwards: the conditions are part of the write. The outer SELECT reads the row as the
# statement found it, so a refused or no-op update is explained without a second round trip.
UPDATE_ROW = """
WITH updated AS (
  UPDATE sandbox_jobs
     SET job_status = COALESCE(%(status)s::text, job_status),
         started_at = COALESCE(%(started_at)s::timestamptz, started_at),
         slurm_job_id = COALESCE(%(slurm_job_id)s::text, slurm_job_id)
   WHERE id = %(id)s AND username = %(owner)s::text
     AND (%(status)s::text IS NULL OR job_status IS NULL
          OR array_position(ARRAY['Pending', 'Started', 'Finished'], job_status)
             <= array_position(ARRAY['Pending', 'Started', 'Finished'], %(status)s::text))
  RETURNING 1
)
SELECT (SELECT count(*) FROM updated) AS changed, s.id IS NOT NULL AS found, s.username, s.job_status
  FROM (SELECT 1) AS one LEFT JOIN sandbox_jobs AS s ON s.id = %(id)s
"""

# Locks the row for the rest of the upload's transaction: the exactly-once check and the write see one state.
ROW_FOR_UPLOAD = "SELECT username, job_status, metrics::text, is_overlong FROM sandbox_jobs WHERE id = %s FOR UPDATE"

SET_ROW_RESULT = """
UPDATE sandbox_jobs
   SET job_status = 'Finished', metrics = %(metrics)s, stats = %(stats)s, n_trials = %(n_trials)s::integer,
       ended_at = %(ended_at)s::timestamptz, is_overlong = %(is_overlong)s::boolean,
       config = CASE WHEN %(env)s::text IS NOT NULL AND jsonb_typeof(config) = 'object'
                     THEN jsonb_set(config, '{env}', to_jsonb(%(env)s::text)) ELSE config END
 WHERE id = %(id)s AND username = %(owner)s::text
"""

# --------------------------------------------------------------------------- controller state writes

INSERT_SUBMISSION = f"""
INSERT INTO evalrun_submissions ({SUBMISSION_COLUMNS})
VALUES (%(name)s, %(run_tag)s, %(evalrun)s, %(cell_key)s, %(attempt)s, %(fire)s, %(row_id)s, %(job_id)s,
        %(created_at)s, %(model)s, %(benchmark)s, %(gpu_hours)s, %(cluster)s, %(estimated_hours)s,
        %(elapsed_hours)s, %(trials)s, %(concurrency)s)
    ON CONFLICT (name) DO NOTHING
"""

SET_SUBMISSION_JOB_ID = "UPDATE evalrun_submissions SET job_id = %s WHERE name = %s"

SET_SUBMISSION_JOB_END = """
UPDATE evalrun_submissions SET gpu_hours = COALESCE(%s, gpu_hours), elapsed_hours = COALESCE(%s, elapsed_hours)
 WHERE name = %s
"""

FINISH_ATTEMPT = "UPDATE evalrun_submissions SET finished_at = now() WHERE run_tag = %s AND finished_at IS NULL"

PUT_MEMORY = """
INSERT INTO evalrun_cell_memory (cell_key, memory, updated_at) VALUES (%s, %s, now())
    ON CONFLICT (cell_key) DO UPDATE SET memory = excluded.memory, updated_at = excluded.updated_at
"""

# --------------------------------------------------------------------------- leases (the database's clock)

# Free, ours, or expired → ours until now() + ttl. A row comes back only when the lease is now ours.
TRY_LEASE = """
INSERT INTO evalrun_leases (name, holder, expires_at)
VALUES (%(name)s, %(holder)s, now() + make_interval(secs => %(ttl_s)s::float8))
    ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
 WHERE evalrun_leases.holder = excluded.holder OR evalrun_leases.expires_at <= now()
RETURNING holder
"""

LEASE_HOLDER = "SELECT holder FROM evalrun_leases WHERE name = %s AND expires_at > now()"

DELETE_LEASE = "DELETE FROM evalrun_leases WHERE name = %s AND holder = %s"

# --------------------------------------------------------------------------- quarantine (the database's clock)

# Repeating one replaces its reason and owner and sets its end to the new now() + ttl; one still in force keeps its
# start. A released one stays released against the same reason until it would have ended (ControllerState.quarantine):
# then nothing is written, and no row comes back.
PUT_QUARANTINE = """
INSERT INTO evalrun_quarantine AS q (kind, scope, name, reason, until, since, owner)
VALUES (%(kind)s, %(scope)s, %(name)s, %(reason)s, now() + make_interval(secs => %(ttl_s)s::float8), now(),
        %(owner)s)
    ON CONFLICT (kind, scope, name) DO UPDATE
   SET reason = excluded.reason, until = excluded.until, owner = excluded.owner, released_at = NULL,
       since = CASE WHEN q.until > now() AND q.released_at IS NULL THEN q.since ELSE excluded.since END
 WHERE q.released_at IS NULL OR q.until <= now() OR q.reason <> excluded.reason
RETURNING 1
"""

# The record stays (its reason and end): what keeps the same decision from bringing it back.
RELEASE_QUARANTINE = """
UPDATE evalrun_quarantine SET released_at = now()
 WHERE kind = %(kind)s AND scope = %(scope)s AND name = %(name)s AND until > now() AND released_at IS NULL
RETURNING 1
"""

# --------------------------------------------------------------------------- cell owners

# Free, ours, or not renewed within the TTL → ours now. Sorted, so two claimers lock rows in the same order
# (no deadlock); DISTINCT, because an upsert may not touch one row twice.
CLAIM_CELLS = """
INSERT INTO evalrun_cell_owners (cell_key, evalrun, renewed_at)
SELECT key, %(evalrun)s::text, now() FROM (SELECT DISTINCT unnest(%(cell_keys)s::text[]) AS key) AS named ORDER BY key
    ON CONFLICT (cell_key) DO UPDATE SET evalrun = excluded.evalrun, renewed_at = excluded.renewed_at
 WHERE evalrun_cell_owners.evalrun = excluded.evalrun
    OR evalrun_cell_owners.renewed_at < now() - make_interval(secs => %(ttl_s)s::float8)
"""

DROP_UNNAMED_CLAIMS = """
DELETE FROM evalrun_cell_owners WHERE evalrun = %(evalrun)s::text AND cell_key <> ALL(%(cell_keys)s::text[])
"""

OWNERS_OF_CELLS = """
SELECT cell_key, evalrun FROM evalrun_cell_owners WHERE cell_key = ANY(%(cell_keys)s::text[]) ORDER BY cell_key
"""

# --------------------------------------------------------------------------- pinggy tunnel leases

TAKE_TUNNEL = """
INSERT INTO evalrun_tunnel_leases (pair, holder, evalrun, leased_at) VALUES (%s, %s, %s, %s)
    ON CONFLICT (pair) DO NOTHING
"""

TUNNEL_HOLDER = "SELECT holder FROM evalrun_tunnel_leases WHERE pair = %s"

DELETE_TUNNEL = "DELETE FROM evalrun_tunnel_leases WHERE pair = %s AND holder = %s"

# --------------------------------------------------------------------------- model selections

RECORD_SELECTION = """
INSERT INTO evalrun_model_selections (evalrun, model, rule, selected_at)
SELECT %(evalrun)s, s.model, s.rule, s.selected_at
  FROM unnest(%(models)s::text[], %(rules)s::text[], %(times)s::timestamptz[]) AS s(model, rule, selected_at)
    ON CONFLICT (evalrun, model) DO NOTHING
"""

# --------------------------------------------------------------------------- notifications (an outbox; the database's clock)

LOCK_EVALRUN_NOTIFICATIONS = "SELECT pg_advisory_xact_lock(%s::integer, hashtext(%s))"

EPISODES_OF_EVALRUN = "SELECT subject, event, episode, active FROM evalrun_notify_episodes WHERE evalrun = %s"

PUT_EPISODES = """
INSERT INTO evalrun_notify_episodes (evalrun, subject, event, episode, active, changed_at)
SELECT %(evalrun)s, e.subject, e.event, e.episode, e.active, now()
  FROM unnest(%(subjects)s::text[], %(events)s::text[], %(episodes)s::integer[], %(active)s::boolean[])
       AS e(subject, event, episode, active)
    ON CONFLICT (evalrun, subject, event) DO UPDATE
   SET episode = excluded.episode, active = excluded.active, changed_at = excluded.changed_at
"""

QUEUE_NOTIFICATIONS = """
INSERT INTO evalrun_notifications
       (id, evalrun, webhook, subject, label, event, episode, detail, state, next_attempt_at, created_at)
SELECT q.id, %(evalrun)s, q.webhook, q.subject, q.label, q.event, q.episode, q.detail, 'pending', now(), now()
  FROM unnest(%(ids)s::text[], %(webhooks)s::text[], %(subjects)s::text[], %(labels)s::text[], %(events)s::text[],
              %(episodes)s::integer[], %(details)s::text[]) AS q(id, webhook, subject, label, event, episode, detail)
    ON CONFLICT (id) DO NOTHING
"""

UNDELIVERED_NOTIFICATIONS = """
SELECT id, evalrun, webhook, subject, label, event, episode, detail, state, attempts, last_error, claimed_by,
       created_at
  FROM evalrun_notifications WHERE evalrun = %s AND state <> 'delivered' ORDER BY created_at, id
"""

# Pending, due, and free (unclaimed, ours, expired, or the claim of a sender known dead).
CLAIM_NOTIFICATION = """
UPDATE evalrun_notifications SET claimed_by = %(holder)s, claim_until = now() + make_interval(secs => %(claim_s)s::float8)
 WHERE id = %(id)s AND state = 'pending' AND next_attempt_at <= now()
   AND (claimed_by IS NULL OR claimed_by = %(holder)s OR claim_until <= now() OR claimed_by = %(take_from)s)
RETURNING id
"""

NOTIFICATION_DELIVERED = """
UPDATE evalrun_notifications
   SET state = 'delivered', attempts = attempts + 1, last_error = '', finished_at = now(),
       claimed_by = NULL, claim_until = NULL
 WHERE id = %(id)s AND claimed_by = %(holder)s
"""

NOTIFICATION_FAILED = """
UPDATE evalrun_notifications
   SET state = CASE WHEN %(give_up)s::boolean THEN 'given_up' ELSE 'pending' END, attempts = attempts + 1,
       last_error = %(error)s, next_attempt_at = now() + make_interval(secs => %(retry_s)s::float8),
       finished_at = CASE WHEN %(give_up)s::boolean THEN now() END, claimed_by = NULL, claim_until = NULL
 WHERE id = %(id)s AND claimed_by = %(holder)s
"""

# --------------------------------------------------------------------------- row audit marks (`evalctl db audit`)

ROW_AUDITS = """
SELECT row_id, gate, verdict, refusal, reason, audited_at FROM evalrun_row_audit WHERE row_id = ANY(%s::text[])
"""

# One statement for every mark; the same verdict again keeps the first mark (and its audited_at), another replaces it.
PUT_ROW_AUDITS = """
INSERT INTO evalrun_row_audit (row_id, gate, verdict, refusal, reason, audited_at)
SELECT m.row_id, m.gate, m.verdict, m.refusal, m.reason, now()
  FROM unnest(%(row_ids)s::text[], %(gates)s::integer[], %(verdicts)s::text[], %(refusals)s::text[],
              %(reasons)s::text[]) AS m(row_id, gate, verdict, refusal, reason)
    ON CONFLICT (row_id) DO UPDATE
   SET gate = excluded.gate, verdict = excluded.verdict, refusal = excluded.refusal, reason = excluded.reason,
       audited_at = excluded.audited_at
 WHERE (evalrun_row_audit.gate, evalrun_row_audit.verdict, evalrun_row_audit.refusal, evalrun_row_audit.reason)
       IS DISTINCT FROM (excluded.gate, excluded.verdict, excluded.refusal, excluded.reason)
"""


# --------------------------------------------------------------------------- retry requests (RULES §13)

RETRY_COLUMNS = "id, cell_key, evalrun, requested_by, requested_at, reason, consumed_by, consumed_attempt, consumed_at"

RETRIES_OF_CELLS = f"""
SELECT {RETRY_COLUMNS} FROM evalrun_retry_requests WHERE cell_key = ANY(%(cell_keys)s::text[])
 ORDER BY requested_at, id
"""

INSERT_RETRY = """
INSERT INTO evalrun_retry_requests (id, cell_key, evalrun, requested_by, requested_at, reason)
VALUES (%(id)s, %(cell_key)s, %(evalrun)s, %(requested_by)s, %(requested_at)s, %(reason)s)
    ON CONFLICT (id) DO NOTHING
"""

# One statement, so one transaction: a new attempt's intent, and the retry requests it consumes (fire 1 only; a
# repeated intent inserts nothing and consumes nothing).
INSERT_SUBMISSION_CONSUMING_RETRIES = f"""
WITH recorded AS (
{INSERT_SUBMISSION.strip()}
    RETURNING name, cell_key, attempt, fire
)
UPDATE evalrun_retry_requests r SET consumed_by = recorded.name, consumed_attempt = recorded.attempt,
       consumed_at = now()
  FROM recorded WHERE recorded.fire = 1 AND r.cell_key = recorded.cell_key AND r.consumed_by IS NULL
"""
