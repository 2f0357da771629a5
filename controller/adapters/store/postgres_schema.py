"""The PostgreSQL store's schema: the OT-Agent tables, which belong to the lab (Supabase in production), created
only where absent with Supabase's types (uuid ids, jsonb documents, timestamptz times) and never altered; the
reconciler's own `evalrun_*` tables, from the versioned files in `migrations/`, applied under an advisory lock
and recorded; the columns later migrations added, for a reader of a database they have not reached. The
statements of the store's operations are in `postgres_sql`.
"""

from __future__ import annotations

# Arbitrary but fixed key of the advisory lock (pg_advisory_xact_lock(key)) schema setup takes (the others: sql)
SCHEMA_LOCK = 0x65766C72756E0001
MIGRATIONS = "evalrun_schema_migrations"  # version, name, applied_at of every migration applied

OT_AGENT_TABLES = ("models", "benchmarks", "sandbox_jobs")
OWN_TABLES = ("evalrun_submissions", "evalrun_leases", "evalrun_cell_owners", "evalrun_tunnel_leases",
              "evalrun_cell_memory", "evalrun_quarantine", "evalrun_model_selections", "evalrun_notify_episodes",
              "evalrun_notifications", "evalrun_row_audit", "evalrun_retry_requests")

# Created one by one, only where absent (CREATE needs a privilege a lab user may lack even when the table
# exists, so existing tables are not even named in a CREATE). Indexes only come with a table we create.
OT_AGENT_DDL = {
    "models": """
CREATE TABLE IF NOT EXISTS models (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name             text NOT NULL,
    base_model_id    uuid REFERENCES models(id),
    duplicate_of     uuid REFERENCES models(id),
    created_by       text,
    creation_time    timestamptz DEFAULT now(),
    weights_location text
);
CREATE INDEX IF NOT EXISTS models_name ON models (name);
CREATE INDEX IF NOT EXISTS models_duplicate_of ON models (duplicate_of);
""",
    "benchmarks": """
CREATE TABLE IF NOT EXISTS benchmarks (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name         text NOT NULL UNIQUE,
    duplicate_of uuid REFERENCES benchmarks(id)
);
CREATE INDEX IF NOT EXISTS benchmarks_duplicate_of ON benchmarks (duplicate_of);
""",
    "sandbox_jobs": """
CREATE TABLE IF NOT EXISTS sandbox_jobs (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    created_at     timestamptz DEFAULT now(),
    job_name       text,
    username       text,
    submitted_at   timestamptz,
    started_at     timestamptz,
    ended_at       timestamptz,
    n_trials       integer,
    n_rep_eval     integer,
    config         jsonb,
    metrics        jsonb,
    stats          jsonb,
    model_id       uuid REFERENCES models(id),
    benchmark_id   uuid REFERENCES benchmarks(id),
    agent_id       uuid,
    job_status     text,
    slurm_job_id   text,
    hf_traces_link text,
    is_overlong    boolean DEFAULT false
);
CREATE INDEX IF NOT EXISTS sandbox_jobs_model_benchmark ON sandbox_jobs (model_id, benchmark_id);
""",
}

EXISTING_TABLES = "SELECT t FROM unnest(%s::text[]) AS t WHERE to_regclass(quote_ident(t)) IS NOT NULL"

TAKE_SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(%s)"

MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS evalrun_schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""

APPLIED_MIGRATIONS = "SELECT version FROM evalrun_schema_migrations"

RECORD_MIGRATION = "INSERT INTO evalrun_schema_migrations (version, name, applied_at) VALUES (%s, %s, now())"

# Columns later migrations added to a table (0004: GPU-hours; 0007: a quarantine's start, owner and release; 0009: a
# submission's cluster; 0010: a sized job's estimate and elapsed hours; 0011: an attempt's trials and concurrency): a
# read-only store on a database they have not reached reads the table without them.
ADDED_COLUMNS = {"evalrun_submissions": ("model", "benchmark", "gpu_hours", "finished_at", "cluster",
                                         "estimated_hours", "elapsed_hours", "trials", "concurrency"),
                 "evalrun_quarantine": ("since", "owner", "released_at")}

PRESENT_COLUMNS = """
SELECT attname::text FROM pg_attribute
 WHERE attrelid = to_regclass(%(table)s) AND attname = ANY(%(columns)s::text[]) AND NOT attisdropped
"""
