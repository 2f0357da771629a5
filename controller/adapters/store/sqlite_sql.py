"""Every SQL statement of the SQLite store's operations (its tables: `sqlite_schema`).

Name lists travel as ONE JSON parameter (`json_each`), so a pass costs the same few statements
whether an EvalRun names ten models or five hundred.
"""

from collections.abc import Collection

# --------------------------------------------------------------------------- observe


# kind, id, name, duplicate_of — both families in one statement. A null name list means every row.
FAMILIES = """
WITH
  model_canon AS (
    SELECT COALESCE(duplicate_of, id) AS id FROM models
     WHERE :models IS NULL OR name IN (SELECT value FROM json_each(:models))
  ),
  bench_canon AS (
    SELECT COALESCE(duplicate_of, id) AS id FROM benchmarks
     WHERE :benchmarks IS NULL OR name IN (SELECT value FROM json_each(:benchmarks))
  )
SELECT 'model', id, name, duplicate_of FROM models
 WHERE id IN (SELECT id FROM model_canon) OR duplicate_of IN (SELECT id FROM model_canon)
UNION ALL
SELECT 'benchmark', id, name, duplicate_of FROM benchmarks
 WHERE id IN (SELECT id FROM bench_canon) OR duplicate_of IN (SELECT id FROM bench_canon)
ORDER BY 1, 2
"""

ROW_COLUMNS = (
    "id, job_name, username, job_status, created_at, submitted_at, started_at, ended_at,"
    " slurm_job_id, model_id, benchmark_id, config, metrics, is_overlong, n_rep_eval"
)

ROWS_IN_FAMILIES = f"""
SELECT {ROW_COLUMNS} FROM sandbox_jobs
 WHERE (:all_models OR model_id IN (SELECT value FROM json_each(:model_ids)))
   AND (:all_benchmarks OR benchmark_id IN (SELECT value FROM json_each(:benchmark_ids)))
 ORDER BY id
"""

SUBMISSION_FIELDS = ("name", "run_tag", "evalrun", "cell_key", "attempt", "fire", "row_id", "job_id", "created_at",
                     "model", "benchmark", "gpu_hours", "cluster", "estimated_hours", "elapsed_hours", "trials",
                     "concurrency")
SUBMISSION_COLUMNS = ", ".join(SUBMISSION_FIELDS)
GPU_HISTORY_COLUMNS = frozenset(("model", "benchmark", "gpu_hours", "finished_at"))


def submission_columns(lacking: Collection[str] = ()) -> str:
    """The record's columns but those `lacking`: a read-only store reads a file made by an earlier version (which a
    reader never alters) as it is, its records without what was added since."""
    return ", ".join(field for field in (*SUBMISSION_FIELDS, "finished_at") if field not in lacking)


SUBMISSIONS_OF = """
SELECT {columns} FROM evalrun_submissions
 WHERE evalrun = :evalrun OR cell_key IN (SELECT value FROM json_each(:cell_keys))
 ORDER BY created_at, name
"""
# every EvalRun's (`evalctl get`)
EVERY_SUBMISSION = "SELECT {columns} FROM evalrun_submissions ORDER BY created_at, name"
EVERY_MEMORY = "SELECT cell_key, memory FROM evalrun_cell_memory"

# Finished attempts of the named benchmarks whose every job's GPU-hours are recorded, newest first.
GPU_HISTORY_OF = """
SELECT run_tag, MIN(model) AS model, MIN(benchmark) AS benchmark, SUM(gpu_hours) AS gpu_hours, {wall} AS wall_hours,
       {size}
  FROM evalrun_submissions
 WHERE finished_at IS NOT NULL AND benchmark IN (SELECT value FROM json_each(:benchmarks))
 GROUP BY run_tag
HAVING COUNT(gpu_hours) = COUNT(*) AND MIN(model) IS NOT NULL
 ORDER BY MAX(finished_at) DESC, run_tag
 LIMIT :history_max
"""


def gpu_history(lacking: Collection[str]) -> str:
    """The history of a table that may lack later columns (read as NULL): an attempt's wall time, its jobs' elapsed
    hours summed when every one of them is recorded (0010); the trials it was to run and at what concurrency (0011)."""
    wall = "NULL" if "elapsed_hours" in lacking else \
        "CASE WHEN COUNT(elapsed_hours) = COUNT(*) THEN SUM(elapsed_hours) END"
    size = "NULL AS trials, NULL AS concurrency" if "trials" in lacking else \
        "MAX(trials) AS trials, MAX(concurrency) AS concurrency"
    return GPU_HISTORY_OF.format(wall=wall, size=size)

OWNERS_OF_CELLS = """
SELECT cell_key, evalrun, renewed_at FROM evalrun_cell_owners
 WHERE cell_key IN (SELECT value FROM json_each(:cell_keys)) AND renewed_at >= :stale_before ORDER BY cell_key
"""

MEMORY_OF_CELLS = """
SELECT cell_key, memory FROM evalrun_cell_memory WHERE cell_key IN (SELECT value FROM json_each(:cell_keys))
"""

# Every quarantine still in force (the table is small: no filter by EvalRun). Fixed-width UTC text sorts as time.
LIVE_QUARANTINES = """
SELECT kind, scope, name, reason, until, since, owner FROM evalrun_quarantine
 WHERE until > :now AND released_at IS NULL ORDER BY kind, scope, name
"""
# a read-only store on a file made before since/owner (never altered by a reader): nothing was released there
LEGACY_LIVE_QUARANTINES = """
SELECT kind, scope, name, reason, until FROM evalrun_quarantine WHERE until > :now ORDER BY kind, scope, name
"""

PUT_MEMORY = "INSERT OR REPLACE INTO evalrun_cell_memory (cell_key, memory, updated_at) VALUES (?, ?, ?)"

ROW_BY_ID = f"SELECT {ROW_COLUMNS} FROM sandbox_jobs WHERE id = ?"

# --------------------------------------------------------------------------- writes

INSERT_SUBMISSION = f"""
INSERT OR IGNORE INTO evalrun_submissions ({SUBMISSION_COLUMNS})
VALUES (:name, :run_tag, :evalrun, :cell_key, :attempt, :fire, :row_id, :job_id, :created_at, :model, :benchmark,
        :gpu_hours, :cluster, :estimated_hours, :elapsed_hours, :trials, :concurrency)
"""

SET_SUBMISSION_JOB_ID = "UPDATE evalrun_submissions SET job_id = ? WHERE name = ?"

SET_SUBMISSION_JOB_END = """
UPDATE evalrun_submissions SET gpu_hours = COALESCE(?, gpu_hours), elapsed_hours = COALESCE(?, elapsed_hours)
 WHERE name = ?
"""

FINISH_ATTEMPT = "UPDATE evalrun_submissions SET finished_at = ? WHERE run_tag = ? AND finished_at IS NULL"

# Every row of a name (legacy data has several); Python picks one (codec.registry_order), because
# creation_time is text here, in whatever spelling its writer chose, and text order is not time order.
MODELS_NAMED = "SELECT id, duplicate_of, creation_time FROM models WHERE name = ?"

INSERT_MODEL = "INSERT INTO models (id, name, created_by, creation_time) VALUES (?, ?, ?, ?)"

BENCHMARKS_NAMED = "SELECT id, duplicate_of FROM benchmarks WHERE name = ?"

INSERT_BENCHMARK = "INSERT INTO benchmarks (id, name) VALUES (?, ?)"

INSERT_ROW = """
INSERT OR IGNORE INTO sandbox_jobs (
    id, created_at, job_name, username, submitted_at, started_at, n_trials, n_rep_eval,
    config, model_id, benchmark_id, job_status, slurm_job_id, is_overlong
) VALUES (
    :id, :created_at, :job_name, :username, :submitted_at, :started_at, :n_trials, :n_rep_eval,
    :config, :model_id, :benchmark_id, :job_status, :slurm_job_id, 0
)
"""

ROW_OWNER_AND_STATUS = "SELECT username, job_status, metrics, is_overlong FROM sandbox_jobs WHERE id = ?"

# Ours only, and never backwards: the conditions are part of the write, not a read before it.
UPDATE_ROW = """
UPDATE sandbox_jobs
   SET job_status = COALESCE(:status, job_status),
       started_at = COALESCE(:started_at, started_at),
       slurm_job_id = COALESCE(:slurm_job_id, slurm_job_id)
 WHERE id = :id AND username = :owner
   AND (:status IS NULL OR job_status IS NULL
        OR CASE job_status WHEN 'Pending' THEN 0 WHEN 'Started' THEN 1 WHEN 'Finished' THEN 2 END
           <= CASE :status WHEN 'Pending' THEN 0 WHEN 'Started' THEN 1 WHEN 'Finished' THEN 2 END)
"""

SET_ROW_RESULT = """
UPDATE sandbox_jobs
   SET job_status = 'Finished', metrics = :metrics, stats = :stats, n_trials = :n_trials, ended_at = :ended_at,
       is_overlong = :is_overlong,
       config = CASE WHEN :env IS NULL OR NOT json_valid(config) THEN config
                     WHEN json_type(config) = 'object' THEN json_set(config, '$.env', :env) ELSE config END
 WHERE id = :id AND username = :owner
"""

# --------------------------------------------------------------------------- leases

LEASE_BY_NAME = "SELECT holder, expires_at FROM evalrun_leases WHERE name = ?"

PUT_LEASE = "INSERT OR REPLACE INTO evalrun_leases (name, holder, expires_at) VALUES (?, ?, ?)"

DELETE_LEASE = "DELETE FROM evalrun_leases WHERE name = ? AND holder = ?"

# --------------------------------------------------------------------------- quarantine

# Repeating one replaces its reason and owner and sets its end to the new now + ttl; one still in force keeps its
# start. A released one stays released against the same reason until it would have ended (ControllerState.quarantine):
# then nothing is written (rowcount 0).
PUT_QUARANTINE = """
INSERT INTO evalrun_quarantine (kind, scope, name, reason, until, since, owner)
VALUES (:kind, :scope, :name, :reason, :until, :now, :owner)
    ON CONFLICT (kind, scope, name) DO UPDATE
   SET reason = excluded.reason, until = excluded.until, owner = excluded.owner, released_at = NULL,
       since = CASE WHEN evalrun_quarantine.until > :now AND evalrun_quarantine.released_at IS NULL
                    THEN evalrun_quarantine.since ELSE excluded.since END
 WHERE evalrun_quarantine.released_at IS NULL OR evalrun_quarantine.until <= :now
    OR evalrun_quarantine.reason <> excluded.reason
"""

# The record stays (its reason and end): what keeps the same decision from bringing it back.
RELEASE_QUARANTINE = """
UPDATE evalrun_quarantine SET released_at = :now
 WHERE kind = :kind AND scope = :scope AND name = :name AND until > :now AND released_at IS NULL
"""

# --------------------------------------------------------------------------- cell owners

# Free, ours, or not renewed since :stale_before → ours now. `WHERE true` lets SQLite parse the upsert.
CLAIM_CELLS = """
INSERT INTO evalrun_cell_owners (cell_key, evalrun, renewed_at)
SELECT value, :evalrun, :now FROM json_each(:cell_keys) WHERE true
    ON CONFLICT (cell_key) DO UPDATE SET evalrun = excluded.evalrun, renewed_at = excluded.renewed_at
 WHERE evalrun_cell_owners.evalrun = excluded.evalrun OR evalrun_cell_owners.renewed_at < :stale_before
"""

DROP_UNNAMED_CLAIMS = """
DELETE FROM evalrun_cell_owners
 WHERE evalrun = :evalrun AND cell_key NOT IN (SELECT value FROM json_each(:cell_keys))
"""

# --------------------------------------------------------------------------- pinggy tunnel leases

TUNNEL_LEASES = "SELECT pair, holder, evalrun, leased_at FROM evalrun_tunnel_leases ORDER BY pair"

TAKE_TUNNEL = """
INSERT INTO evalrun_tunnel_leases (pair, holder, evalrun, leased_at) VALUES (?, ?, ?, ?)
    ON CONFLICT (pair) DO NOTHING
"""

TUNNEL_HOLDER = "SELECT holder FROM evalrun_tunnel_leases WHERE pair = ?"

DELETE_TUNNEL = "DELETE FROM evalrun_tunnel_leases WHERE pair = ? AND holder = ?"

# --------------------------------------------------------------------------- model selections

# creation_time is text here in whatever spelling its writer chose: codec decodes it, Python filters by time.
REGISTERED_MODELS = "SELECT name, creation_time FROM models WHERE duplicate_of IS NULL"

MODEL_SELECTIONS = """
SELECT model, rule, selected_at FROM evalrun_model_selections WHERE evalrun = ? ORDER BY selected_at, model
"""

RECORD_SELECTION = """
INSERT OR IGNORE INTO evalrun_model_selections (evalrun, model, rule, selected_at) VALUES (?, ?, ?, ?)
"""

# --------------------------------------------------------------------------- notifications (an outbox)

EPISODES_OF_EVALRUN = "SELECT subject, event, episode, active FROM evalrun_notify_episodes WHERE evalrun = ?"

PUT_EPISODE = """
INSERT INTO evalrun_notify_episodes (evalrun, subject, event, episode, active, changed_at) VALUES (?, ?, ?, ?, ?, ?)
    ON CONFLICT (evalrun, subject, event) DO UPDATE
   SET episode = excluded.episode, active = excluded.active, changed_at = excluded.changed_at
"""

QUEUE_NOTIFICATION = """
INSERT OR IGNORE INTO evalrun_notifications
       (id, evalrun, webhook, subject, label, event, episode, detail, state, next_attempt_at, created_at)
VALUES (:id, :evalrun, :webhook, :subject, :label, :event, :episode, :detail, 'pending', :now, :now)
"""

NOTIFICATION_COLUMNS = ("id, evalrun, webhook, subject, label, event, episode, detail, state, attempts, last_error, "
                        "claimed_by, created_at")

UNDELIVERED_NOTIFICATIONS = f"""
SELECT {NOTIFICATION_COLUMNS} FROM evalrun_notifications
 WHERE evalrun = ? AND state <> 'delivered' ORDER BY created_at, id
"""

# Pending, due, and free (unclaimed, ours, expired, or the claim of a sender known dead). Fixed-width UTC text
# sorts as time.
CLAIM_NOTIFICATION = """
UPDATE evalrun_notifications SET claimed_by = :holder, claim_until = :until
 WHERE id = :id AND state = 'pending' AND next_attempt_at <= :now
   AND (claimed_by IS NULL OR claimed_by = :holder OR claim_until <= :now OR claimed_by = :take_from)
"""

NOTIFICATION_DELIVERED = """
UPDATE evalrun_notifications
   SET state = 'delivered', attempts = attempts + 1, last_error = '', finished_at = :now,
       claimed_by = NULL, claim_until = NULL
 WHERE id = :id AND claimed_by = :holder
"""

NOTIFICATION_FAILED = """
UPDATE evalrun_notifications
   SET state = CASE WHEN :give_up THEN 'given_up' ELSE 'pending' END, attempts = attempts + 1,
       last_error = :error, next_attempt_at = :next, finished_at = CASE WHEN :give_up THEN :now END,
       claimed_by = NULL, claim_until = NULL
 WHERE id = :id AND claimed_by = :holder
"""

# --------------------------------------------------------------------------- row audit marks (`evalctl db audit`)

ROW_AUDITS = """
SELECT row_id, gate, verdict, refusal, reason, audited_at FROM evalrun_row_audit
 WHERE row_id IN (SELECT value FROM json_each(?))
"""

# The same verdict again keeps the first mark (and its audited_at); another replaces it.
PUT_ROW_AUDIT = """
INSERT INTO evalrun_row_audit (row_id, gate, verdict, refusal, reason, audited_at)
VALUES (:row_id, :gate, :verdict, :refusal, :reason, :now)
    ON CONFLICT (row_id) DO UPDATE
   SET gate = excluded.gate, verdict = excluded.verdict, refusal = excluded.refusal, reason = excluded.reason,
       audited_at = excluded.audited_at
 WHERE evalrun_row_audit.gate IS NOT excluded.gate OR evalrun_row_audit.verdict IS NOT excluded.verdict
    OR evalrun_row_audit.refusal IS NOT excluded.refusal OR evalrun_row_audit.reason IS NOT excluded.reason
"""


# --------------------------------------------------------------------------- retry requests (RULES §13)

RETRY_COLUMNS = "id, cell_key, evalrun, requested_by, requested_at, reason, consumed_by, consumed_attempt, consumed_at"

RETRIES_OF_CELLS = f"""
SELECT {RETRY_COLUMNS} FROM evalrun_retry_requests WHERE cell_key IN (SELECT value FROM json_each(:cell_keys))
 ORDER BY requested_at, id
"""

INSERT_RETRY = f"""
INSERT OR IGNORE INTO evalrun_retry_requests ({RETRY_COLUMNS})
VALUES (:id, :cell_key, :evalrun, :requested_by, :requested_at, :reason, NULL, NULL, NULL)
"""

# run in the transaction that records a new attempt's intent: the request and the attempt it released are one fact
CONSUME_RETRIES = """
UPDATE evalrun_retry_requests SET consumed_by = :name, consumed_attempt = :attempt, consumed_at = :now
 WHERE cell_key = :cell_key AND consumed_by IS NULL
"""
