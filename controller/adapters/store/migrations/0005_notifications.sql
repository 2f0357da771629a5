-- 0005: notifications, an outbox (core/notify.py, docs/DECISIONS.md "Notifications").
-- evalrun_notify_episodes: per EvalRun, subject (a cell key, or '' for the EvalRun) and event, its latest stay in
-- that state (episode 0: never entered) and whether it goes on. evalrun_notifications: one message per (episode,
-- webhook), its id derived from them, so queueing it again is a no-op; a sender claims it (claimed_by/claim_until,
-- by the database's clock), delivers it, and marks it delivered, or failed with its back-off, or given up.
CREATE TABLE IF NOT EXISTS evalrun_notify_episodes (
    evalrun    text NOT NULL,
    subject    text NOT NULL,
    event      text NOT NULL,
    episode    integer NOT NULL,
    active     boolean NOT NULL,
    changed_at timestamptz NOT NULL,
    PRIMARY KEY (evalrun, subject, event)
);
CREATE TABLE IF NOT EXISTS evalrun_notifications (
    id              text PRIMARY KEY,
    evalrun         text NOT NULL,
    webhook         text NOT NULL,
    subject         text NOT NULL,
    label           text NOT NULL,
    event           text NOT NULL,
    episode         integer NOT NULL,
    detail          text NOT NULL,
    state           text NOT NULL,
    attempts        integer NOT NULL DEFAULT 0,
    last_error      text NOT NULL DEFAULT '',
    next_attempt_at timestamptz NOT NULL,
    claimed_by      text,
    claim_until     timestamptz,
    created_at      timestamptz NOT NULL,
    finished_at     timestamptz
);
CREATE INDEX IF NOT EXISTS evalrun_notifications_state ON evalrun_notifications (evalrun, state);
