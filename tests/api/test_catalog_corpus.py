"""The shipped failure catalog matches failures, not mentions (RULES §9).

- No pattern matches a healthy job's output (`tests/fixtures/benign_logs/`), at either stage.
- Every pattern matches a realistic failure of its entry, and each such failure is diagnosed as that entry with the
  whole catalog in its order (`tests/fixtures/failure_logs/<entry>.txt`, excerpts after `#--- <where from>` lines):
  tightening a pattern cannot silently kill an entry.
- Every give-up line of the job scripts we ship is diagnosed, or listed in NOT_CATALOGUED with the reason.
- No pattern can backtrack without bound on a long line: every repeat is bounded and none is nested, and each
  pattern starts with a literal. What this buys is measured by `make bench-catalog`, never asserted here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from re import _parser as sre  # the parse tree of a pattern: what the static check reads

import pytest

from controller.api.catalog import load_catalog
from controller.core.health import diagnose
from controller.core.remedies import FailureMode, FailureStage

REPO = Path(__file__).resolve().parents[2]
BENIGN = sorted((REPO / "tests" / "fixtures" / "benign_logs").glob("*.txt"))
FAILURES = REPO / "tests" / "fixtures" / "failure_logs"
MODES = load_catalog().failures.modes_for([])
PATTERNS = sorted({(mode.name, pattern) for mode in MODES for pattern in mode.patterns})
REPEAT_BOUND = 500  # the longest gap a pattern may bridge within a line (a long path, a message between anchors)


def mode_id(mode: FailureMode) -> str:
    return f"{mode.name}-{mode.when.value}"


# --------------------------------------------------------------------------- healthy logs


def test_the_benign_corpus_is_there():
    assert len(BENIGN) >= 6, BENIGN


@pytest.mark.parametrize("stage", list(FailureStage), ids=lambda s: s.value)
@pytest.mark.parametrize("path", BENIGN, ids=lambda p: p.name)
def test_no_pattern_matches_a_healthy_log(path: Path, stage: FailureStage):
    found = diagnose(path.read_text(), MODES, stage)

    assert found is None, f"{path.name}: {found.mode.name} matched a healthy line: {found.line!r}"


# --------------------------------------------------------------------------- realistic failures


def excerpts(name: str) -> list[str]:
    text = (FAILURES / f"{name}.txt").read_text()
    return [part for part in re.split(r"^#--- .*\n", text, flags=re.MULTILINE) if part.strip()]


def test_every_entry_has_its_failures_and_only_entries_have():
    assert {p.stem for p in FAILURES.glob("*.txt")} == {mode.name for mode in MODES}


@pytest.mark.parametrize("mode", MODES, ids=mode_id)
def test_every_pattern_matches_a_realistic_failure_diagnosed_as_its_entry(mode: FailureMode):
    found = excerpts(mode.name)

    for excerpt in found:
        diagnosis = diagnose(excerpt, MODES, mode.when)
        assert diagnosis is not None and diagnosis.mode.name == mode.name, \
            f"diagnosed as {diagnosis and diagnosis.mode.name}, not {mode.name}:\n{excerpt}"
    for pattern in mode.patterns:
        assert any(re.search(pattern, excerpt, re.MULTILINE) for excerpt in found), \
            f"{mode.name}: {pattern!r} matches none of its failures: a dead pattern, or a missing excerpt"


# --------------------------------------------------------------------------- the job scripts' give-ups

# What a give-up line's variables hold in a real fire (every one a give-up names must be here).
PLAUSIBLE = {
    "0": "/var/spool/slurmd/job4242/slurm_script", "RUN_TAG": "ev_qwen3-8b/tb2",
    "HARBOR": "/tmp/evalrun-eval-env/bin/harbor", "PLUGIN_DIR": "/home/eval/evalrun/eval/harbor",
    "DATASET": "DCAgent2/bfcl-parity", "tries": "10", "EVAL_HARBOR_CONFIG": "dcagent_eval_config.yaml",
    "EVAL_CONFIG_YAML": "/home/eval/configs/terminus2.yaml",
    "scaffold": "/home/eval/evalrun/eval/harbor/configs/terminus2_no_override.yaml",
    "job.run_dir": "/scratch/evals/jobs/ev_qwen3-8b__tb2__0123456789ab__a1", "EVAL_SHARD": "2/2",
    "error": "EVAL_SHARD must be i/K with 0 <= i < K, e.g. 0/2 (got '2/2')",
}
# Give-ups left to the hold that shows the job's last lines (rule JobFailedAtStart), and why.
NOT_CATALOGUED = {
    "usage: ": "the controller passes the arguments: wrong ones are its bug, which no remedy fixes",
    "EVAL_JOBS_DIR must be set": "the controller always sets it: the same",
    "eval_harbor: bad run tag ": "the controller makes run tags: the same",
    "already holds a job; set EVAL_RESUME=1": "the fake Harbor's check; the real script resumes such a dir itself",
    "eval_harbor: no Harbor at ": "the line names the path and its fix (scripts/eval-env.sh); a catalogued hold "
                                  "would show its advice instead of the line",
    "eval_harbor: no host_env.py in ": "the line names the plugin dir (EVAL_HARBOR_PLUGIN_DIR): the same",
    "eval_harbor: dataset dir not found: ": "the line names the dataset the cluster lacks: the same",
    "EVAL_SHARD": "the controller sets it: a wrong one is its bug, which no remedy fixes",
}
JOB_SCRIPTS = sorted([*(REPO / "eval").rglob("*.sbatch"), *(REPO / "eval").rglob("*.sh"),
                      *(REPO / "specs").rglob("*.py")])
SHELL_GIVE_UP = re.compile(r'\becho((?:[ \t]+"[^"]*")+)[ \t]*>&2[ \t]*;?[ \t]*exit[ \t]+[1-9]')
UNSET_GIVE_UP = re.compile(r"\$\{(\w+):\?([^}]*)\}")  # bash: "<script>: line N: NAME: message"
PYTHON_GIVE_UP = re.compile(r'print\(f?"([^"]*)", file=sys\.stderr\)\n[ \t]*return [1-9]')
VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))|\{([\w.]+)\}")


def plausible(message: str) -> str:
    """The message with its variables ($VAR, ${VAR}, an f-string's {name}) replaced by what a fire has there."""
    return VARIABLE.sub(lambda m: PLAUSIBLE[next(g for g in m.groups() if g)], message)


def give_ups() -> list[tuple[str, str]]:
    """(script, message) of every give-up: an `echo "…" >&2; exit N`, a `${VAR:?message}`, a stderr print then
    a non-zero return."""
    found = []
    for path in JOB_SCRIPTS:
        text = path.read_text().replace("\\\n", " ")  # continued lines are one command
        script = str(path.relative_to(REPO))
        messages = [" ".join(re.findall(r'"([^"]*)"', m.group(1))) for m in SHELL_GIVE_UP.finditer(text)]
        messages += [f"{name}: {message}" for name, message in UNSET_GIVE_UP.findall(text)]
        messages += PYTHON_GIVE_UP.findall(text)
        found += [(script, plausible(message)) for message in messages]
    return found


GIVE_UPS = give_ups()


def test_the_give_ups_are_all_read():
    messages = [message for _, message in GIVE_UPS]

    assert "eval_harbor: vLLM not healthy after 10 checks (EVAL_VLLM_MAX_RETRIES)" in messages
    assert "eval_harbor: vLLM exited before it was healthy" in messages
    assert any(m.startswith("eval_harbor: EVAL_CONFIG_YAML must be a bare file name") and "is doubled" in m
               for m in messages), "a give-up continued over two lines is one message"
    assert {key for key in NOT_CATALOGUED if any(key in m for m in messages)} == set(NOT_CATALOGUED), \
        "a deliberate non-match that no script prints any more"


@pytest.mark.parametrize(("script", "line"), GIVE_UPS, ids=[f"{s}: {m[:50]}" for s, m in GIVE_UPS])
def test_every_give_up_of_our_job_scripts_is_diagnosed_or_deliberately_not(script: str, line: str):
    found = diagnose(line, MODES, FailureStage.START)
    reason = next((why for key, why in NOT_CATALOGUED.items() if key in line), None)

    if reason is None:
        assert found is not None, f"{script}: {line!r} matches no start entry: catalogue it, or list it in " \
                                  "NOT_CATALOGUED with the reason"
    else:
        assert found is None, f"{script}: {line!r} is listed as not catalogued ({reason}) but {found.mode.name} " \
                              "matches it"


# --------------------------------------------------------------------------- linear on a long line

REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT)


def subpatterns(arg: object) -> Iterator[sre.SubPattern]:
    """The parsed patterns inside a node's argument (a group, an alternative, a repeated item)."""
    if isinstance(arg, sre.SubPattern):
        yield arg
    elif isinstance(arg, tuple | list):
        for item in arg:
            yield from subpatterns(item)


def repeats(tree: sre.SubPattern, outer: int = 0) -> Iterator[tuple[int, int]]:
    """(upper bound, repeats around it) of every repeat in a parsed pattern."""
    for op, arg in tree:
        if op in REPEATS:
            yield arg[1], outer
        for child in subpatterns(arg):
            yield from repeats(child, outer + (op in REPEATS))


def starts_with_literal(tree: sre.SubPattern) -> bool:
    """The first thing to match is a literal character (or a set of them), in every alternative: the regex engine
    scans ahead for it, and backtracks only where the pattern's own text is. (A `\\b` first makes it try every
    position: linear still, but some 25 times slower.)"""
    if not tree:
        return False
    op, arg = tree[0]
    if op == sre.SUBPATTERN:
        return starts_with_literal(arg[-1])
    if op == sre.BRANCH:
        return all(starts_with_literal(alternative) for alternative in arg[1])
    return op == sre.LITERAL or (op == sre.IN and all(kind == sre.LITERAL for kind, _ in arg))


def problems(pattern: str) -> list[str]:
    """Why a pattern may be slow on a long line ([] if it cannot)."""
    tree = sre.parse(pattern)
    bounds = list(repeats(tree))
    checks = {
        "an unbounded repeat": any(high == sre.MAXREPEAT for high, _ in bounds),
        "a repeat inside a repeat": any(outer for _, outer in bounds),
        f"a repeat over {REPEAT_BOUND}": any(REPEAT_BOUND < high < sre.MAXREPEAT for high, _ in bounds),
        "no literal to start from": not starts_with_literal(tree),
    }
    return [problem for problem, found in checks.items() if found]


@pytest.mark.parametrize(("pattern", "expected"), [
    (r"NCCL.*(?i:timeout|timed out)", ["an unbounded repeat"]),  # the old nccl-timeout: 4.5 s on a 64 KiB line
    (r"foo\S*bar", ["an unbounded repeat"]),
    (r"x[^\n]+y\d+", ["an unbounded repeat"]),
    (r"x(?:ab{0,9}){0,9}c", ["a repeat inside a repeat"]),
    (r"a[^\n]{0,5000}b", [f"a repeat over {REPEAT_BOUND}"]),
    (r"(?i)[^\n]{0,200}timeout", ["no literal to start from"]),
    (r"\bWatchdog caught", ["no literal to start from"]),
    (r"(?:Foo|Bar)Error: \d{1,3} [Xx]", []),
])
def test_the_static_check_knows_a_slow_pattern(pattern: str, expected: list[str]):
    assert problems(pattern) == expected


@pytest.mark.parametrize(("name", "pattern"), PATTERNS, ids=[f"{n}: {p[:40]}" for n, p in PATTERNS])
def test_no_pattern_can_backtrack_without_bound(name: str, pattern: str):
    assert problems(pattern) == [], name
