-- 0003: the models a modelSelector took for an EvalRun (sticky: a selected model stays a cell of it).
-- One record per (evalrun, model); recording one twice keeps the first (when and by which rule it was taken).
CREATE TABLE IF NOT EXISTS evalrun_model_selections (
    evalrun     text NOT NULL,
    model       text NOT NULL,
    rule        text NOT NULL,
    selected_at timestamptz NOT NULL,
    PRIMARY KEY (evalrun, model)
);
