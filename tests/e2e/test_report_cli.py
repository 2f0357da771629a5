"""`evalctl report`: `-o` is a format as in every command, the file goes to `--out`; the old `-o PATH` is refused
with the option that replaced it, and nothing is written."""

from __future__ import annotations

import json

from ruamel.yaml import YAML


def test_report_writes_to_out_and_prints_its_data_as_json_or_yaml(cluster):
    cluster.write(models=["org/a-8B"], datasets=["DCAgent/tiny_a"],
                  env={"FAKE_HARBOR_TASKS": "4", "FAKE_HARBOR_TRIAL_SECONDS": "0.01"})
    cluster.evalctl("reconcile", "--loop", "--interval", "0.5", "--until-done")
    page = cluster.root / "out" / "page.html"

    written = cluster.evalctl("report", "--out", str(page))

    assert f"wrote {page}: 1 EvalRun(s), 1 cell(s)" in written.stdout
    assert page.read_text().lstrip().lower().startswith("<!doctype html>")
    as_json = json.loads(cluster.evalctl("report", "-o", "json").stdout)
    [cell] = as_json["runs"][0]["cells"]
    assert (cell["model"], cell["phase"]) == ("org/a-8B", "Completed") and 0 <= cell["score"] <= 1
    assert YAML(typ="safe").load(cluster.evalctl("report", "-o", "yaml").stdout) == as_json
    cluster.evalctl("report", "-o", "json", "--out", str(cluster.root / "data.json"))
    assert json.loads((cluster.root / "data.json").read_text()) == as_json


def test_a_path_given_to_o_is_refused_with_the_option_that_takes_it(cluster):
    cluster.write(models=["org/a-8B"], datasets=["DCAgent/tiny_a"])

    refused = cluster.evalctl("report", "-o", "report.html", check=False)

    assert refused.returncode == 2, refused
    assert refused.stderr.strip() == ("evalctl: -o report.html: not a format (html, json, yaml); -o is the format, "
                                      "as in plan and status: write the file with --out report.html")
    assert "Traceback" not in refused.stderr and refused.stdout == ""
    assert not (cluster.root / "report.html").exists() and not any(cluster.root.glob("*.html"))
