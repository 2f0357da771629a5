-- 0010: a sized job's walltime estimate (written with the intent) and how long it ran (recorded once it ended):
-- what `walltime: auto` learns its margin from. Nullable: fixed-walltime jobs and older records have neither.
ALTER TABLE evalrun_submissions ADD COLUMN IF NOT EXISTS estimated_hours double precision;
ALTER TABLE evalrun_submissions ADD COLUMN IF NOT EXISTS elapsed_hours double precision;
