-- 0008: a human's requests to release a held cell once (`evalctl retry`, the `evalrun.io/retry` annotation; RULES
-- §13). Pending while `consumed_by` is null; the first new attempt of its cell recorded after it consumes it, in
-- the statement that records that attempt's intent (`consumed_by`: its submission, `consumed_attempt`: its number).
-- Requests are never deleted: they are the cell's history of who retried it, when and why.
CREATE TABLE IF NOT EXISTS evalrun_retry_requests (
    id               text PRIMARY KEY,
    cell_key         text NOT NULL,
    evalrun          text NOT NULL,
    requested_by     text NOT NULL,
    requested_at     timestamptz NOT NULL,
    reason           text NOT NULL DEFAULT '',
    consumed_by      text,
    consumed_attempt integer,
    consumed_at      timestamptz
);
CREATE INDEX IF NOT EXISTS evalrun_retry_requests_cell ON evalrun_retry_requests (cell_key);
