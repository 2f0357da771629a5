-- 0004: GPU-hours. Each submission records its job's actual GPU-hours once the job ended (they outlive sacct's
-- window), the model and benchmark name its history is grouped by, and when its attempt finished (its report
-- was written): finished attempts of a benchmark and size band are what estimates are the median of.
-- Nullable: records made before stay as they are (no history, hours unknown).
ALTER TABLE evalrun_submissions
    ADD COLUMN IF NOT EXISTS model       text,
    ADD COLUMN IF NOT EXISTS benchmark   text,
    ADD COLUMN IF NOT EXISTS gpu_hours   double precision,
    ADD COLUMN IF NOT EXISTS finished_at timestamptz;
CREATE INDEX IF NOT EXISTS evalrun_submissions_finished ON evalrun_submissions (benchmark, finished_at)
    WHERE finished_at IS NOT NULL;
