"""evalctl's output read by a program (cron's log, `grep`, `head`): rows never wrap, and a reader that stops early
ends the output quietly, never as an error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

REPO = Path(__file__).resolve().parents[2]
MODELS = 300  # output larger than a pipe's buffer: the writes after the reader left really fail with EPIPE
LONG_MODEL = "DCAgent/qwen3-32b-sft-terminal-agent-traces-v7-lr2e-5-epochs3-with-a-name-longer-than-a-terminal"


def spec(tmp_path: Path, models: str = ", ".join(f"org/m{i}" for i in range(MODELS))) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(f"""\
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: local}}
spec: {{scheduler: {{type: local}}, jobsDir: {tmp_path}/jobs, logsDir: {tmp_path}/logs,
        jobScript: {REPO}/specs/demo/fake_harbor.py}}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: piped}}
spec: {{cluster: local, models: [{models}], datasets: [org/bench]}}
""")
    return path


@pytest.mark.parametrize("output", ["json", "table"])
def test_a_reader_that_stops_after_one_line_ends_the_output_quietly(tmp_path: Path, output: str) -> None:
    command = [sys.executable, "-m", "controller.entry.cli", "plan", "-f", str(spec(tmp_path)), "--store",
               f"sqlite:///{tmp_path}/store.db", "-o", output]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                          cwd=tmp_path) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()  # `head -1` exits
        errors = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
    assert first.strip(), "the plan was being written"
    assert (code, errors.splitlines()) == (0, [f"store: sqlite:///{tmp_path}/store.db (--store)",
                                               f"evalctl: no store at {tmp_path}/store.db: nothing has run from here"]), \
        "which store, that it is new, and nothing about the closed pipe"


@pytest.mark.parametrize("command", ["plan", "status"])
def test_piped_rows_never_wrap_a_name(tmp_path: Path, command: str) -> None:
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    shown = subprocess.run([sys.executable, "-m", "controller.entry.cli", command, "-f", str(spec(tmp_path, LONG_MODEL)),
                            "--store", f"sqlite:///{tmp_path}/store.db"], capture_output=True, text=True, env=env,
                           cwd=tmp_path, stdin=subprocess.DEVNULL, timeout=120, check=False)
    assert shown.returncode == 0, shown.stderr
    [row] = [line for line in shown.stdout.splitlines() if LONG_MODEL in line]  # grep finds it whole, once
    assert row.count("│") >= 3, f"one table row holds the name and its cells: {row}"


@pytest.mark.parametrize("command", [("plan",), ("validate",), ("presets",)])
def test_yaml_holds_the_same_document_as_json(tmp_path: Path, command: tuple[str, ...]) -> None:
    path = spec(tmp_path, "org/a-8B, org/b-8B")
    with_spec = () if command == ("presets",) else ("-f", str(path))
    with_store = ("--store", f"sqlite:///{tmp_path}/store.db") if command == ("plan",) else ()

    def shown(output: str) -> str:
        done = subprocess.run([sys.executable, "-m", "controller.entry.cli", *command, *with_spec, *with_store, "-o",
                               output], capture_output=True, text=True, cwd=tmp_path, stdin=subprocess.DEVNULL,
                              timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    as_yaml = YAML(typ="safe").load(shown("yaml"))
    assert as_yaml == json.loads(shown("json")) and as_yaml, "the same keys and values"
