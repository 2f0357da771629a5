"""`evalctl validate` on the broken-spec corpus: FILE:LINE:COL: messages, exit 2, never a traceback."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from controller.entry.cli import app

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
