"""`evalctl validate` on the broken-spec corpus: FILE:LINE:COL: messages, exit 2, never a traceback."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from controller.entry.cli import app

REPO = Path(__file__).resolve().parents[2]
CORPUS = sorted((Path(__file__).resolve().parents[1] / "api" / "broken").glob("*.yaml"))


def test_corpus_is_big_enough():
    assert len(CORPUS) >= 20


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_validate_reports_the_position(path):
    line, col, message = re.match(r"# expect: (\d+):(\d+): (.*)", path.read_text().splitlines()[0]).groups()
    result = CliRunner().invoke(app, ["validate", "-f", str(path)])
    assert result.exit_code == 2
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"{path}:{line}:{col}: ") and message in first
    assert "Traceback" not in result.output and "s3cr3t" not in result.stderr, "no traceback, no secret"


def test_a_real_process_exits_2_and_writes_nothing(tmp_path):
    store = tmp_path / "store.db"
    result = subprocess.run([sys.executable, "-m", "controller.entry.cli", "reconcile", "--once", "-f",
                             str(CORPUS[0]), "--store", f"sqlite:///{store}"], capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert re.match(rf"{re.escape(str(CORPUS[0]))}:\d+:\d+: ", result.stderr)
    assert not store.exists(), "bad input must not touch the store"


@pytest.mark.parametrize("path", CORPUS[::7], ids=[p.stem for p in CORPUS[::7]])
def test_validate_json_gives_the_same_positions_to_a_program(path):
    line, col, message = re.match(r"# expect: (\d+):(\d+): (.*)", path.read_text().splitlines()[0]).groups()
    result = CliRunner().invoke(app, ["validate", "-o", "json", "-f", str(path)])
    assert result.exit_code == 2
    shown = json.loads(result.stdout)
    first = shown["errors"][0]
    assert shown["ok"] is False and (first["file"], first["line"], first["col"]) == (str(path), int(line), int(col))
    assert message in first["message"]


def test_validate_json_counts_what_a_valid_spec_holds():
    result = CliRunner().invoke(app, ["validate", "-o", "json", "-f", str(REPO / "specs" / "demo.yaml")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"ok": True, "errors": [], "evalruns": 1, "clusters": 1, "cells": 6}
