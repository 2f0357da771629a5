"""`evalctl get evalruns|cells`: what a store populated by a real reconcile knows, listed without a spec, as a
table, JSON or YAML; no store at the place is said, never listed as empty."""

from __future__ import annotations

import json
import os
import re

from ruamel.yaml import YAML

from tests.fixtures.evalctl import run_evalctl

MODELS = ["org/a-8B", "org/b-32B"]


def converged(cluster) -> dict[str, dict]:
    """Two cells run to their upload; the status the spec gives them, by model (what `get` must agree with)."""
    cluster.write(models=MODELS, datasets=["DCAgent/tiny_a"],
                  env={"FAKE_HARBOR_TASKS": "4", "FAKE_HARBOR_TRIAL_SECONDS": "0.01"})
    cluster.evalctl("reconcile", "--loop", "--interval", "0.5", "--until-done")
    [run] = json.loads(cluster.evalctl("status", "-o", "json").stdout)["evalruns"]
    return {cell["model"]: cell for cell in run["cells"]}


def test_get_cells_and_evalruns_list_the_store_without_a_spec(cluster):
    status = converged(cluster)
    cluster.spec.unlink()  # nothing but the store

    cells = json.loads(cluster.evalctl("get", "cells", "--store", cluster.store, "-o", "json").stdout)["cells"]
    as_yaml = YAML(typ="safe").load(cluster.evalctl("get", "cells", "--store", cluster.store, "-o", "yaml").stdout)
    table = cluster.evalctl("get", "cells", "--store", cluster.store).stdout

    assert as_yaml == {"cells": cells}
    assert [c["model"] for c in cells] == MODELS
    for cell in cells:
        shown = status[cell["model"]]
        assert (cell["evalrun"], cell["benchmark"], cell["cluster"], cell["status"]) == ("e2e", "tiny_a", "local",
                                                                                        "Finished")
        assert (cell["score"], cell["n_scored"], cell["provisional"]) == (shown["score"], shown["n_scored"], True)
        assert cell["attempts"] == 1 and cell["job_id"] and cell["run_tag"].endswith("__a1")
        row = next(line for line in table.splitlines() if cell["model"] in line).rstrip()  # AGE "9 s " beside "10 s"
        assert re.search(rf"e2e +{re.escape(cell['model'])} +tiny_a +local +Finished +{cell['score']:.3f} +"
                         rf"{cell['n_scored']} +yes +1 +{cell['job_id']} +\d+ (s|min)$", row), table

    runs = json.loads(cluster.evalctl("get", "evalruns", "--store", cluster.store, "-o", "json").stdout)["evalruns"]
    assert [(r["evalrun"], r["cells"], r["statuses"], r["scored"], r["provisional"], r["clusters"]) for r in runs] \
        == [("e2e", 2, {"Finished": 2}, 2, 2, ["local"])]
    runs_table = cluster.evalctl("get", "evalruns", "--store", cluster.store).stdout
    assert re.search(r"^e2e +2 +2 Finished +2 +2 +local +\d+ (s|min) *$", runs_table, re.MULTILINE), runs_table


def test_no_store_at_the_place_is_said_and_nothing_is_made_there(cluster):
    nowhere = cluster.root / "nowhere.db"

    missing = cluster.evalctl("get", "cells", "--store", f"sqlite:///{nowhere}", check=False)

    assert missing.returncode == 1 and missing.stdout == ""
    store_line, said = missing.stderr.strip().splitlines()
    assert store_line == f"store: sqlite:///{nowhere} (--store)"
    assert said == (f"evalctl: no store at sqlite:///{nowhere}: nothing has been recorded there (a "
                                      "reconcile records there; --store, --state or $EVALCTL_STORE name another place)")
    assert not nowhere.exists(), "a read never creates a store"


def test_an_unknown_kind_is_refused_with_the_kinds(cluster):
    refused = cluster.evalctl("get", "jobs", "--store", cluster.store, check=False)

    assert refused.returncode == 2 and "evalruns" in refused.stderr and "cells" in refused.stderr, refused.stderr


def test_without_a_store_named_get_reads_the_store_of_the_directory_it_stands_in(cluster):
    """No -f and no --store: the `.evalctl/store.db` where it runs (where a spec beside it keeps its store)."""
    environment = {key: value for key, value in os.environ.items() if key != "EVALCTL_STORE"}
    here = cluster.root / ".evalctl" / "store.db"

    missing = run_evalctl(("get", "cells"), spec=cluster.spec, store=cluster.store, env=environment,
                          cwd=cluster.root, check=False)

    assert missing.returncode == 1, missing.stderr
    assert missing.stderr.splitlines()[0].startswith(f"store: sqlite:///{here} "), missing.stderr
    assert not here.exists(), "a read never creates a store"
