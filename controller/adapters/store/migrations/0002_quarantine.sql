-- 0002: quarantines (a node, a pinggy pair, a cluster's launches kept out of use until `until`).
-- One record per (kind, scope, name): repeating a quarantine replaces its reason and end. Expiry is by the
-- database's clock (`until > now()`), so reconcilers with skewed clocks agree on what is still in force.
CREATE TABLE IF NOT EXISTS evalrun_quarantine (
    kind   text NOT NULL,
    scope  text NOT NULL,
    name   text NOT NULL,
    reason text NOT NULL,
    until  timestamptz NOT NULL,
    PRIMARY KEY (kind, scope, name)
);
