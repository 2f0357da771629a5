"""Hostile spec files: each one stops `evalctl` at FILE:LINE:COL with exit 2, no traceback, no store touched.

A red team's inputs (numbers that overflow timedelta, nesting that overflows the stack, aliases that explode,
binary files, names and environments the kernel or the file system would refuse mid-pass), each run through the
real CLI in a subprocess. What a spec file may hold is bounded at load time, so every command refuses the same.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.evalctl import run_evalctl

REPO = Path(__file__).resolve().parents[2]
FAKE_HARBOR = REPO / "specs" / "demo" / "fake_harbor.py"
CLUSTER = f"""apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: local}}
spec:
  scheduler: {{type: local}}
  jobsDir: jobs
  logsDir: logs
  jobScript: {FAKE_HARBOR}
"""
RUN = """---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {name: run}
spec:
  cluster: local
  models: [org/model-8B]
  datasets: [org/bench]
"""
SPEC = CLUSTER + RUN


@dataclass(frozen=True)
class Hostile:
    """A spec file's text (or bytes), what the error must say, and where it must point: `offset` characters
    right of where `at` first occurs, or 1:1 without `at`."""

    content: str | bytes
    says: str
    at: str | None = None
    offset: int = 0

    def position(self) -> tuple[int, int]:
        if self.at is None:
            return 1, 1
        text = self.content.decode(errors="replace") if isinstance(self.content, bytes) else self.content
        before = text[:text.index(self.at)]
        return before.count("\n") + 1, len(before) - before.rfind("\n") + self.offset


def run_line(extra: str) -> str:
    return SPEC + extra


def laughs(levels: int) -> str:
    """The "billion laughs": each level lists the previous one nine times (9**levels values expanded)."""
    lines = ["  x0: &x0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 9)}]" for i in range(1, levels)]
    return SPEC.replace("spec:\n  cluster", "lols:\n" + "\n".join(lines) + "\nspec:\n  cluster")


def deep_block(levels: int) -> str:
    return run_line("  overrides:\n" + "".join(f"{'  ' * (i + 2)}k{i}:\n" for i in range(levels)))


HOSTILE: dict[str, Hostile] = {
    "duration 1e308 (timedelta overflow)": Hostile(run_line("  staleStartedHours: 1e308\n"),
                                                   "less than or equal to 8760", "1e308"),
    "duration .inf": Hostile(run_line("  monitor: {settleMinutes: .inf}\n"), "finite number", ".inf"),
    "duration .nan": Hostile(run_line("  stalePendingHours: .nan\n"), "finite number", ".nan"),
    "a 400-digit count": Hostile(run_line(f"  nAttempts: {'9' * 400}\n"), "less than or equal to 100", "999"),
    "a 400-digit walltime": Hostile(CLUSTER + f"  timeLimit: '{'9' * 400}'\n" + RUN, "at most 32 characters", "'999"),
    "walltime of a million days": Hostile(CLUSTER + "  timeLimit: '1000000-00:00:00'\n" + RUN,
                                          "longer than 365 days", "'1000000"),
    # the document is level 1, spec 2, the first bracket 3: the 63rd '[' is level 65, and so is the key of the 62nd '{'
    "10,000 nested flow sequences": Hostile(run_line("  agentKwargs: " + "[" * 10_000 + "]" * 10_000 + "\n"),
                                            "nested more than 64 levels", "[[", offset=62),
    "10,000 nested flow mappings": Hostile(run_line("  overrides: " + "{a: " * 10_000 + "}" * 10_000 + "\n"),
                                           "nested more than 64 levels", "{a:", offset=61 * 4 + 1),
    "100 nested block mappings": Hostile(deep_block(100), "nested more than 64 levels", "k61:"),
    "billion laughs": Hostile(laughs(9), "aliases in this document expand to more than 10000", "*x3"),
    "an alias that contains itself": Hostile(run_line("  agentKwargs: &a [x, *a]\n"), "(a cycle)", "*a]"),
    "empty file": Hostile("", "no EvalRun or EvalCluster in this file"),
    "only whitespace and comments": Hostile("\n   \n# a spec, one day\n  \n", "no EvalRun or EvalCluster"),
    "only document markers": Hostile("---\n---\n...\n", "no EvalRun or EvalCluster"),
    "NUL bytes": Hostile(SPEC.encode() + b"\0\0\0", "not a text file (it holds NUL bytes)"),
    "invalid UTF-8": Hostile(SPEC.encode().replace(b"org/model", b"org/\xff\xfeodel"), "not a text file (invalid UTF-8"),
    "a file over 1 MiB": Hostile(SPEC + "#" * (1 << 20), "larger than 1024 KiB"),
    "a raw escape character": Hostile(SPEC.replace("org/model", "org/\x1bmodel"), "U+001B is not allowed in YAML",
                                      "\x1b"),
    "a 5,000-character model name": Hostile(SPEC.replace("org/model-8B", "m" * 5000), "at most 200 characters",
                                            "m" * 5000),
    "a NUL in a model name": Hostile(SPEC.replace("org/model-8B", '"org/mo\\0del"'), "U+0000", '"org/mo'),
    "a zero-width space in a model name": Hostile(SPEC.replace("org/model-8B", "org/mo\u200bdel"), "U+200B",
                                                  "org/mo"),
    "a dataset that names no benchmark": Hostile(SPEC.replace("[org/bench]", "['/']"), "names no dataset", "'/'"),
    "1,001 models": Hostile(SPEC.replace("[org/model-8B]", "[" + ", ".join(f"o/m{i}" for i in range(1001)) + "]"),
                            "at most 1000 items", "[o/m0"),
    "10,500 cells": Hostile(SPEC.replace("[org/model-8B]", "[" + ", ".join(f"o/m{i}" for i in range(500)) + "]")
                            .replace("[org/bench]", "[" + ", ".join(f"o/d{i}" for i in range(21)) + "]"),
                            "make 10500 cells, more than 10000", "[o/m0"),
    "40 KiB of agentKwargs": Hostile(run_line("  agentKwargs: [" + ", ".join(["k=" + "v" * 1000] * 40) + "]\n"),
                                     "more than 32 KiB", "[k=v"),
    "65 agentKwargs": Hostile(run_line("  agentKwargs: [" + ", ".join(["k=v"] * 65) + "]\n"), "at most 64 items",
                              "[k=v"),
    "a 40 KiB env value": Hostile(CLUSTER + "  env: {BIG: " + "x" * 40_000 + "}\n" + RUN, "at most 32768 characters",
                                  "xxx"),
    "300 KiB of env in all": Hostile(CLUSTER + "  env: {" + ", ".join(f"V{i}: {'x' * 30_000}" for i in range(10))
                                     + "}\n" + RUN, "more than 256 KiB", "{V0"),
    "an env name with '='": Hostile(CLUSTER + "  env: {'A=B': x}\n" + RUN, "not an environment variable name",
                                    "'A=B'"),
    "a NUL in an env value": Hostile(CLUSTER + '  env: {A: "x\\0y"}\n' + RUN, "NUL", '"x'),
    "an ssh host that is an option": Hostile(
        SPEC.replace("{type: local}", "{type: slurm, ssh: -oProxyCommand=sh}")
        .replace("jobsDir: jobs", "jobsDir: /j").replace("logsDir: logs", "logsDir: /l"),
        "not starting with '-'", "-oProxy"),
    "a key that is a list": Hostile(run_line("  ? [a, b]\n  : x\n"), "keys must be strings", "[a, b]"),
    "a key that is a number": Hostile(run_line("  8: x\n"), "this key is a number", "8: x"),
    "an empty key": Hostile(run_line("  ~: x\n"), "this key is empty", "~: x"),
    "tab indentation": Hostile(run_line("\tsuspend: true\n"), "found character '\\t'", "\tsuspend"),
}


def write(tmp_path: Path, content: str | bytes) -> Path:
    path = tmp_path / "hostile.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def evalctl(*args: str, spec: Path, tmp_path: Path) -> tuple[int, str, str]:
    result = run_evalctl(args, spec=spec, store=f"sqlite:///{tmp_path}/state/store.db", env=os.environ, cwd=tmp_path,
                         check=False, timeout=120)
    return result.returncode, result.stdout, result.stderr


def assert_refused(code: int, stdout: str, stderr: str, where: str, says: str, tmp_path: Path) -> None:
    assert code == 2, f"rc={code}\n{stdout}\n{stderr}"
    first = stderr.splitlines()[0]
    assert re.match(rf"{re.escape(where)}: ", first) and says in first, first
    assert "Traceback" not in stdout + stderr
    assert not (tmp_path / "state").exists(), "a bad spec must not create or touch the store"
    assert not (tmp_path / "logs").exists(), "nothing was submitted"


@pytest.mark.parametrize("case", HOSTILE.values(), ids=HOSTILE.keys())
def test_reconcile_refuses_a_hostile_spec_at_its_position(tmp_path: Path, case: Hostile) -> None:
    path = write(tmp_path, case.content)
    line, col = case.position()
    assert_refused(*evalctl("reconcile", "--once", spec=path, tmp_path=tmp_path),
                   where=f"{path}:{line}:{col}", says=case.says, tmp_path=tmp_path)


@pytest.mark.parametrize("command", [("validate",), ("plan",), ("status",), ("explain", "org/model-8B", "org/bench"),
                                     ("reconcile", "--loop", "--interval", "0.1", "--until-done")])
@pytest.mark.parametrize("name", ["duration 1e308 (timedelta overflow)", "10,000 nested flow sequences"])
def test_every_command_refuses_the_same(tmp_path: Path, command: tuple[str, ...], name: str) -> None:
    case = HOSTILE[name]
    path = write(tmp_path, case.content)
    line, col = case.position()
    args = (*command, "-f", str(path)) if command == ("validate",) else command
    assert_refused(*evalctl(*args, spec=path, tmp_path=tmp_path), where=f"{path}:{line}:{col}", says=case.says,
                   tmp_path=tmp_path)


NOT_FILES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "/dev/zero": (lambda _: Path("/dev/zero"), "not a regular file"),
    "a FIFO (would block a reader for ever)": (lambda tmp: _fifo(tmp / "spec.yaml"), "not a regular file"),
    "a directory with no YAML": (lambda tmp: _directory_without_yaml(tmp / "specs"), "holds no *.yaml or *.yml"),
    "a path that does not exist": (lambda tmp: tmp / "nope.yaml", "no such file or directory"),
}


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _directory_without_yaml(path: Path) -> Path:
    path.mkdir()
    (path / "README.md").write_text("kind: EvalRun\n")
    return path


@pytest.mark.parametrize("make, says", NOT_FILES.values(), ids=NOT_FILES.keys())
def test_what_is_not_a_spec_file_is_refused_at_1_1(tmp_path: Path, make: Callable[[Path], Path], says: str) -> None:
    path = make(tmp_path)
    assert_refused(*evalctl("reconcile", "--once", spec=path, tmp_path=tmp_path), where=f"{path}:1:1", says=says,
                   tmp_path=tmp_path)


FINE: dict[str, str | bytes] = {
    "a UTF-8 byte order mark": "\ufeff" + SPEC,
    "CRLF line endings": SPEC.replace("\n", "\r\n"),
    "a BOM and CRLF": ("\ufeff" + SPEC.replace("\n", "\r\n")).encode(),
    "a merge key and a re-used anchor": run_line("  monitor:\n    <<: &m {settleMinutes: 5}\n    staleNearMinutes: 9\n"
                                                 "  resume: &m {maxTotalFires: 3}\n"),
    "64 levels of nesting, the most allowed": SPEC.replace("{name: run}", "{name: run, x: " + "[" * 62 + "]" * 62 + "}"),
    "a 200-character local checkpoint path with unicode": SPEC.replace("org/model-8B", "/ckpt/ørg/" + "m" * 190),
}


@pytest.mark.parametrize("content", FINE.values(), ids=FINE.keys())
def test_odd_but_valid_specs_still_load(tmp_path: Path, content: str | bytes) -> None:
    path = write(tmp_path, content)
    code, stdout, stderr = evalctl("validate", "-f", str(path), spec=path, tmp_path=tmp_path)
    assert code == 0 and "ok: 1 EvalRun(s), 1 EvalCluster(s), 1 cell(s)" in stdout, stderr
