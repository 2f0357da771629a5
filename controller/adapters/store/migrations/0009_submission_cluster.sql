-- 0009: the cluster each submission's job was submitted to (its ClusterRef as text). An EvalRun with several
-- clusters binds a cell to the cluster it launched on; recorded with the intent, the binding survives a restart
-- before the job shows in that cluster's queue. Nullable: records made before name none.
ALTER TABLE evalrun_submissions ADD COLUMN IF NOT EXISTS cluster text;
