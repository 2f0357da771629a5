-- 0007: quarantines a human can see and lift (`evalctl nodes`, the EvalCluster's status; docs/DECISIONS.md
-- "Quarantines a human can see and lift"). `since`: when the quarantine in force began (by the database's clock;
-- null for one recorded before); `owner`: the EvalRun whose pass decided it; `released_at`: when a human lifted it.
-- A released record stays, so the same decision repeated before its `until` does not bring it back.
ALTER TABLE evalrun_quarantine
    ADD COLUMN IF NOT EXISTS since       timestamptz,
    ADD COLUMN IF NOT EXISTS owner       text NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS released_at timestamptz;
