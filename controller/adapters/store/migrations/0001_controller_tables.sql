-- 0001: the reconciler's own bookkeeping (the OT-Agent tables are the lab's and are never migrated).
-- Applied once per database by PostgresStore, recorded in evalrun_schema_migrations; IF NOT EXISTS keeps
-- it harmless where the tables were made by hand.

-- The intents (submission protocol step 1) and the scheduler ids (step 3).
CREATE TABLE IF NOT EXISTS evalrun_submissions (
    name       text PRIMARY KEY,
    run_tag    text NOT NULL,
    evalrun    text NOT NULL,
    cell_key   text NOT NULL,
    attempt    integer NOT NULL,
    fire       integer NOT NULL,
    row_id     text,
    job_id     text,
    created_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS evalrun_submissions_evalrun ON evalrun_submissions (evalrun);
CREATE INDEX IF NOT EXISTS evalrun_submissions_cell ON evalrun_submissions (cell_key);

-- Act-leases: one acting reconciler per EvalRun; expiry by the database's clock.
CREATE TABLE IF NOT EXISTS evalrun_leases (
    name       text PRIMARY KEY,
    holder     text NOT NULL,
    expires_at timestamptz NOT NULL
);

-- Which EvalRun acts for a cell; a claim not renewed within the TTL may be taken over.
CREATE TABLE IF NOT EXISTS evalrun_cell_owners (
    cell_key   text PRIMARY KEY,
    evalrun    text NOT NULL,
    renewed_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS evalrun_cell_owners_evalrun ON evalrun_cell_owners (evalrun);

-- Pinggy pairs handed to jobs, so no two jobs share one.
CREATE TABLE IF NOT EXISTS evalrun_tunnel_leases (
    pair      text PRIMARY KEY,
    holder    text NOT NULL,
    evalrun   text NOT NULL,
    leased_at timestamptz NOT NULL
);

-- What the rules remember about a cell across passes (e.g. a first stalled reading).
CREATE TABLE IF NOT EXISTS evalrun_cell_memory (
    cell_key   text PRIMARY KEY,
    memory     jsonb NOT NULL,
    updated_at timestamptz NOT NULL
);
