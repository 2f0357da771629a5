"""The SQLite store's schema: the tables a store file holds, the columns a file made by an earlier version gains
when it opens, and the names of every table. The first three tables mirror the OT-Agent results schema (RULES §1)
so old tools and dashboards can read what we write; the `evalrun_*` tables are the reconciler's own memory. The
statements of the store's operations are in `sqlite_sql`.
"""

SCHEMA = """
CREATE TABLE IF NOT EXISTS models (
    id               TEXT PRIMARY KEY,
    name             TEXT NOT NULL,
    base_model_id    TEXT REFERENCES models(id),
    duplicate_of     TEXT REFERENCES models(id),
    created_by       TEXT,
    creation_time    TEXT,
    weights_location TEXT
);
CREATE INDEX IF NOT EXISTS models_name ON models(name);
CREATE INDEX IF NOT EXISTS models_duplicate_of ON models(duplicate_of);

CREATE TABLE IF NOT EXISTS benchmarks (
    id           TEXT PRIMARY KEY,
    name         TEXT NOT NULL UNIQUE,
    duplicate_of TEXT REFERENCES benchmarks(id)
);
CREATE INDEX IF NOT EXISTS benchmarks_duplicate_of ON benchmarks(duplicate_of);

CREATE TABLE IF NOT EXISTS sandbox_jobs (
    id             TEXT PRIMARY KEY,
    created_at     TEXT,
    job_name       TEXT,
    username       TEXT,
    submitted_at   TEXT,
    started_at     TEXT,
    ended_at       TEXT,
    n_trials       INTEGER,
    n_rep_eval     INTEGER,
    config         TEXT,
    metrics        TEXT,
    stats          TEXT,
    model_id       TEXT REFERENCES models(id),
    benchmark_id   TEXT REFERENCES benchmarks(id),
    agent_id       TEXT,
    job_status     TEXT,
    slurm_job_id   TEXT,
    hf_traces_link TEXT,
    is_overlong    BOOLEAN DEFAULT 0
);
CREATE INDEX IF NOT EXISTS sandbox_jobs_model_benchmark ON sandbox_jobs(model_id, benchmark_id);

CREATE TABLE IF NOT EXISTS evalrun_submissions (
    name       TEXT PRIMARY KEY,
    run_tag    TEXT NOT NULL,
    evalrun    TEXT NOT NULL,
    cell_key   TEXT NOT NULL,
    attempt    INTEGER NOT NULL,
    fire       INTEGER NOT NULL,
    row_id     TEXT,
    job_id     TEXT,
    created_at TEXT NOT NULL,
    model       TEXT,
    benchmark   TEXT,
    gpu_hours   REAL,
    finished_at TEXT,
    cluster     TEXT,
    estimated_hours REAL,
    elapsed_hours   REAL,
    trials          INTEGER,
    concurrency     INTEGER
);
CREATE INDEX IF NOT EXISTS evalrun_submissions_evalrun ON evalrun_submissions(evalrun);
CREATE INDEX IF NOT EXISTS evalrun_submissions_cell ON evalrun_submissions(cell_key);

CREATE TABLE IF NOT EXISTS evalrun_leases (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    expires_at TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS evalrun_cell_owners (
    cell_key   TEXT PRIMARY KEY,
    evalrun    TEXT NOT NULL,
    renewed_at TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS evalrun_cell_memory (
    cell_key   TEXT PRIMARY KEY,
    memory     TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS evalrun_tunnel_leases (
    pair      TEXT PRIMARY KEY,
    holder    TEXT NOT NULL,
    evalrun   TEXT NOT NULL,
    leased_at TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS evalrun_quarantine (
    kind        TEXT NOT NULL,
    scope       TEXT NOT NULL,
    name        TEXT NOT NULL,
    reason      TEXT NOT NULL,
    until       TEXT NOT NULL,
    since       TEXT,
    owner       TEXT NOT NULL DEFAULT '',
    released_at TEXT,
    PRIMARY KEY (kind, scope, name)
);

CREATE TABLE IF NOT EXISTS evalrun_model_selections (
    evalrun     TEXT NOT NULL,
    model       TEXT NOT NULL,
    rule        TEXT NOT NULL,
    selected_at TEXT NOT NULL,
    PRIMARY KEY (evalrun, model)
);

CREATE TABLE IF NOT EXISTS evalrun_notify_episodes (
    evalrun    TEXT NOT NULL,
    subject    TEXT NOT NULL,
    event      TEXT NOT NULL,
    episode    INTEGER NOT NULL,
    active     BOOLEAN NOT NULL,
    changed_at TEXT NOT NULL,
    PRIMARY KEY (evalrun, subject, event)
);

CREATE TABLE IF NOT EXISTS evalrun_notifications (
    id              TEXT PRIMARY KEY,
    evalrun         TEXT NOT NULL,
    webhook         TEXT NOT NULL,
    subject         TEXT NOT NULL,
    label           TEXT NOT NULL,
    event           TEXT NOT NULL,
    episode         INTEGER NOT NULL,
    detail          TEXT NOT NULL,
    state           TEXT NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT NOT NULL DEFAULT '',
    next_attempt_at TEXT NOT NULL,
    claimed_by      TEXT,
    claim_until     TEXT,
    created_at      TEXT NOT NULL,
    finished_at     TEXT
);
CREATE INDEX IF NOT EXISTS evalrun_notifications_state ON evalrun_notifications(evalrun, state);

CREATE TABLE IF NOT EXISTS evalrun_retry_requests (
    id               TEXT PRIMARY KEY,
    cell_key         TEXT NOT NULL,
    evalrun          TEXT NOT NULL,
    requested_by     TEXT NOT NULL,
    requested_at     TEXT NOT NULL,
    reason           TEXT NOT NULL DEFAULT '',
    consumed_by      TEXT,
    consumed_attempt INTEGER,
    consumed_at      TEXT
);
CREATE INDEX IF NOT EXISTS evalrun_retry_requests_cell ON evalrun_retry_requests(cell_key);

CREATE TABLE IF NOT EXISTS evalrun_row_audit (
    row_id     TEXT PRIMARY KEY,
    gate       INTEGER NOT NULL,
    verdict    TEXT NOT NULL,
    refusal    TEXT,
    reason     TEXT NOT NULL,
    audited_at TEXT NOT NULL
);
"""

# Columns added after a file may have been made (its CREATE TABLE IF NOT EXISTS leaves an old table as it was):
# added by ALTER TABLE when a writable store opens a file without them, each once (SQLite has no ADD COLUMN IF
# NOT EXISTS). 0.4: what GPU-hours are recorded and estimated from (PostgreSQL: migration 0004); then when a
# quarantine began, whose pass decided it and when a human lifted it (migration 0007); then the cluster a
# submission's job went to (migration 0009); then a sized job's estimate and how long it ran (migration 0010); then
# the trials an attempt was to run and at what concurrency (migration 0011).
ADDED_COLUMNS = {"evalrun_submissions": {"model": "TEXT", "benchmark": "TEXT", "gpu_hours": "REAL",
                                         "finished_at": "TEXT", "cluster": "TEXT", "estimated_hours": "REAL",
                                         "elapsed_hours": "REAL", "trials": "INTEGER", "concurrency": "INTEGER"},
                 "evalrun_quarantine": {"since": "TEXT", "owner": "TEXT NOT NULL DEFAULT ''", "released_at": "TEXT"}}

TABLE_COLUMNS = "SELECT name FROM pragma_table_info(?)"

# after the columns exist: an index on a column an old file lacks would fail the whole SCHEMA script
GPU_HISTORY_INDEX = """
CREATE INDEX IF NOT EXISTS evalrun_submissions_finished ON evalrun_submissions(benchmark, finished_at)
 WHERE finished_at IS NOT NULL
"""

OT_AGENT_TABLES = ("models", "benchmarks", "sandbox_jobs")

OWN_TABLES = ("evalrun_submissions", "evalrun_leases", "evalrun_tunnel_leases", "evalrun_cell_owners",
              "evalrun_cell_memory", "evalrun_quarantine", "evalrun_model_selections", "evalrun_notify_episodes",
              "evalrun_notifications", "evalrun_row_audit", "evalrun_retry_requests")

EXISTING_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (SELECT value FROM json_each(?))"
