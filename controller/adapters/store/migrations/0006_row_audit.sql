-- 0006: the admission gate's verdict on rows already in the results DB (`evalctl db audit --apply`, docs/DECISIONS.md
-- "Audit marks"). Keyed by the sandbox_jobs row id as text (uuid in Supabase, text in some lab copies; no foreign
-- key: the lab's tables are never altered). A leaderboard joins it: LEFT JOIN evalrun_row_audit a ON a.row_id =
-- sandbox_jobs.id::text. The sandbox_jobs rows themselves are never written, whoever owns them.
CREATE TABLE IF NOT EXISTS evalrun_row_audit (
    row_id     text PRIMARY KEY,
    gate       integer NOT NULL,
    verdict    text NOT NULL,
    refusal    text,
    reason     text NOT NULL,
    audited_at timestamptz NOT NULL DEFAULT now()
);
