-- 0011: the trials an attempt was to run (the catalog's tasks × nAttempts) and its concurrency, written with the
-- intent: an estimate from attempts of another size is scaled to the cell's (`walltime: auto`, GPU-hours).
-- Nullable: a benchmark whose task count the catalog does not know, and older records, have none.
ALTER TABLE evalrun_submissions ADD COLUMN IF NOT EXISTS trials integer;
ALTER TABLE evalrun_submissions ADD COLUMN IF NOT EXISTS concurrency integer;
