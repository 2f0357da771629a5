"""A cluster's preflight (RULES §12): ONE command where its jobs run — on this host, or one ssh session on the
login node — checks what every launch there depends on, before the first one waits in a queue only to fail.

The command is a fixed `sh` script (`SCRIPT`); what the spec says (paths, partition, account, python) reaches it as
positional arguments, never inside its text (over ssh, `remote_script` quotes each one): a tenant's field cannot
become shell. It prints `key=value` lines after a marker line (a login banner before it is ignored), statuses and
what the cluster lists (never a tenant's value back); `parse_answer` reads them into `PreflightAnswer`, `findings`
turns that into each failure with its fix. Nothing is left behind: the probe file is made with `mktemp` (never
following a planted link) and removed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationError

from controller.adapters.scheduler.commands import CommandFailed, CommandRunner
from controller.adapters.secrets import SecretMask
from controller.core.ports import ObservationError
from controller.core.preflight import Preflight, PreflightFailure
from controller.core.types import Frozen

MARKER = "@preflight"
TIMEOUT_S = 60.0
MIN_PYTHON = (3, 9)  # what the run-dir probe needs (adapters/rundirs/remote.py)
TEXT_MAX = 300  # a command's error line, as reported

# $1 jobs dir ('' = not checked), $2 job script ('' = not checked), $3 partition, $4 account ('' = none set),
# $5 python ('' = not used there), $6 '1' = a SLURM cluster (sinfo, sacctmgr)
SCRIPT = r"""
printf '%s\n' '@preflight'
jobs=$1 script=$2 partition=$3 account=$4 python=$5 slurm=$6
line() { tr '\n\r' '  ' | cut -c1-300; }
user=$(id -un 2>/dev/null) || user=
printf 'user=%s\n' "$(printf '%s' "$user" | line)"
writable() { probe=$(mktemp -- "$1/.evalctl-preflight.XXXXXX" 2>/dev/null) && rm -f -- "$probe"; }
if [ -z "$jobs" ]; then
  echo jobs_dir=skipped
elif [ -d "$jobs" ]; then
  if writable "$jobs"; then echo jobs_dir=ok; else echo jobs_dir=unwritable; fi
elif [ -e "$jobs" ] || [ -L "$jobs" ]; then
  echo jobs_dir=not_a_dir
else
  parent=$jobs
  while [ ! -e "$parent" ] && [ ! -L "$parent" ] && [ "$parent" != / ] && [ "$parent" != . ]; do
    parent=$(dirname -- "$parent")
  done
  printf 'jobs_dir_parent=%s\n' "$(printf '%s' "$parent" | line)"
  if [ ! -d "$parent" ]; then echo jobs_dir=parent_not_dir
  elif writable "$parent"; then echo jobs_dir=creatable
  else echo jobs_dir=parent_unwritable; fi
fi
if [ -z "$script" ]; then echo script=skipped
elif [ -f "$script" ]; then
  if [ -r "$script" ]; then echo script=ok; else echo script=unreadable; fi
elif [ -e "$script" ]; then echo script=not_a_file
else echo script=missing; fi
if [ "$slurm" != 1 ] || [ -z "$partition" ]; then echo partition=skipped
elif listed=$(sinfo -a -h -o %P 2>&1); then
  listed=$(printf '%s\n' "$listed" | tr -d '*' | sed '/^$/d')
  printf 'partitions=%s\n' "$(printf '%s' "$listed" | tr '\n' ',' | line)"
  if printf '%s\n' "$listed" | grep -qxF -- "$partition"; then echo partition=ok; else echo partition=missing; fi
else
  echo partition=unknown
  printf 'partition_error=%s\n' "$(printf '%s\n' "$listed" | tail -n 1 | line)"
fi
if [ "$slurm" != 1 ] || [ -z "$account" ]; then echo account=skipped
elif ! all=$(sacctmgr -n -P show account format=Account 2>&1) ||
     ! mine=$(sacctmgr -n -P show assoc "user=$user" format=Account 2>&1); then
  echo account=unknown
  printf 'account_error=%s\n' "$(printf '%s\n' "$all" "${mine-}" | sed '/^$/d' | tail -n 1 | line)"
else
  mine=$(printf '%s\n' "$mine" | sed '/^$/d' | sort -u)
  printf 'accounts=%s\n' "$(printf '%s' "$mine" | tr '\n' ',' | line)"
  if printf '%s\n' "$mine" | grep -qixF -- "$account"; then echo account=ok
  elif printf '%s\n' "$all" | grep -qixF -- "$account"; then echo account=no_association
  else echo account=no_account; fi
fi
if [ -z "$python" ]; then echo python=skipped
elif version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>&1); then
  echo python=ok
  printf 'python_version=%s\n' "$(printf '%s\n' "$version" | tail -n 1 | line)"
else
  code=$?
  if [ "$code" -eq 126 ] || [ "$code" -eq 127 ]; then echo python=missing; else echo python=failed; fi
  error=$(printf '%s\n' "$version" | sed '/^$/d' | tail -n 1 | line)
  printf 'python_error=%s\n' "${error:-exit $code}"
fi
"""


class PreflightTarget(Frozen):
    """What one cluster's preflight checks, as its spec says: paths as they are where its jobs run."""

    cluster: str = Field(description="the EvalCluster, as plans and holds name it")
    host: str = Field(description="where the checks run, as messages say it: the ssh host, or 'this host'")
    remote: bool = Field(description="over ssh: a path is one on the login node")
    jobs_dir: str | None = Field(description="None: a URL, not checked here")
    job_script: str | None = Field(description="None: not checked here")
    partition: str | None = None
    account: str | None = None
    python: str | None = Field(None, description="scheduler.python where the run-dir probe runs it; None: unused")
    slurm: bool = False

    def argv(self) -> list[str]:
        return ["sh", "-c", SCRIPT, "evalctl-preflight", self.jobs_dir or "", self.job_script or "",
                self.partition or "", self.account or "", self.python or "", "1" if self.slurm else "0"]


class PreflightAnswer(Frozen):
    """What SCRIPT printed: each check's status, and what the cluster listed."""

    user: str = ""
    jobs_dir: Literal["ok", "creatable", "unwritable", "not_a_dir", "parent_not_dir", "parent_unwritable", "skipped"]
    jobs_dir_parent: str = ""
    script: Literal["ok", "missing", "not_a_file", "unreadable", "skipped"]
    partition: Literal["ok", "missing", "unknown", "skipped"]
    partitions: str = ""
    partition_error: str = ""
    account: Literal["ok", "no_account", "no_association", "unknown", "skipped"]
    accounts: str = ""
    account_error: str = ""
    python: Literal["ok", "missing", "failed", "skipped"]
    python_version: str = ""
    python_error: str = ""


def parse_answer(stdout: str) -> PreflightAnswer:
    """SCRIPT's lines after its marker → the answer; anything else (no marker, a line without `=`, a key twice, a
    status it does not print) raises ObservationError: an answer not understood is no preflight passed."""
    lines = stdout.splitlines()
    if MARKER not in lines:
        raise ObservationError("the preflight printed nothing (is `sh` there?)")
    found: dict[str, str] = {}
    for line in lines[lines.index(MARKER) + 1:]:
        key, sep, value = line.partition("=")
        if not sep or key in found:
            raise ObservationError(f"the preflight answered an unexpected line {line[:80]!r}")
        found[key] = value.strip()
    try:
        return PreflightAnswer.model_validate(found)
    except ValidationError as exc:
        raise ObservationError(f"the preflight answered something unexpected: {exc.errors()[0]['loc']} "
                               f"{exc.errors()[0]['msg']}") from None


def run_preflight(commands: CommandRunner, target: PreflightTarget, mask: SecretMask | None = None) -> Preflight:
    """The checks, in one command; raises ObservationError when it could not run or its answer is not understood."""
    mask = mask or SecretMask()
    try:
        result = commands.run(target.argv(), timeout=TIMEOUT_S)
    except CommandFailed as exc:
        raise ObservationError(f"preflight on {target.host}: {exc}") from None
    if result.returncode != 0:
        last = [line for line in result.stderr.splitlines() if line.strip()][-1:]
        raise ObservationError(f"the preflight on {target.host} exited {result.returncode}: "
                               f"{mask.known(last[0].strip()[:TEXT_MAX]) if last else '(no message)'}")
    answer = parse_answer(result.stdout)
    return findings(answer.model_copy(update={key: mask.known(value) for key, value in answer if
                                              key.endswith("_error")}), target)


def findings(answer: PreflightAnswer, target: PreflightTarget) -> Preflight:
    """Each failed check with what to fix; what passed (or could not be checked) in words; a `sinfo` that failed
    makes the preflight unobserved (SLURM did not answer: launches wait), never passed."""
    failures = [failure for check in (_jobs_dir, _job_script, _partition, _account, _python)
                if (failure := check(answer, target)) is not None]
    unobserved = (f"sinfo failed on {target.host}: {answer.partition_error or '(no message)'}"
                  if answer.partition == "unknown" else "")
    return Preflight(cluster=target.cluster, failures=tuple(failures), passed=_passed(answer, target),
                     unobserved=unobserved)


def _who(answer: PreflightAnswer) -> str:
    return answer.user or "the login user"


def _jobs_dir(answer: PreflightAnswer, target: PreflightTarget) -> PreflightFailure | None:
    where, who, parent = f"jobsDir {target.jobs_dir} on {target.host}", _who(answer), answer.jobs_dir_parent
    message = {
        "unwritable": f"{where} is not writable by {who} (a probe file could not be made there): fix its "
                      f"permissions, or set spec.jobsDir to a directory {who} can write",
        "not_a_dir": f"{where} is not a directory: set spec.jobsDir to a directory",
        "parent_not_dir": f"{where} does not exist and cannot be made: {parent} is not a directory; fix spec.jobsDir",
        "parent_unwritable": f"{where} does not exist and {who} cannot make it in {parent}: create it for {who}, or "
                             f"set spec.jobsDir to a directory {who} can write",
    }.get(answer.jobs_dir)
    return PreflightFailure(field="jobsDir", message=message) if message else None


def _job_script(answer: PreflightAnswer, target: PreflightTarget) -> PreflightFailure | None:
    what = {"missing": "does not exist", "not_a_file": "is not a file",
            "unreadable": f"cannot be read by {_who(answer)}"}.get(answer.script)
    if what is None:
        return None
    path = " (a path on the login node)" if target.remote else ""
    return PreflightFailure(field="jobScript", message=f"jobScript {target.job_script} {what} on {target.host}: "
                                                       f"fix spec.jobScript{path}")


def _partition(answer: PreflightAnswer, target: PreflightTarget) -> PreflightFailure | None:
    if answer.partition != "missing":
        return None
    listed = answer.partitions.replace(",", ", ") or "none"
    return PreflightFailure(field="partition", message=f"partition {target.partition} does not exist on "
                                                       f"{target.host} (sinfo lists: {listed}); set spec.partition "
                                                       "to one of them")


def _account(answer: PreflightAnswer, target: PreflightTarget) -> PreflightFailure | None:
    who = _who(answer)
    own = f"one of {who}'s: {answer.accounts.replace(',', ', ')}" if answer.accounts else f"an account of {who}"
    message = {
        "no_account": f"account {target.account} does not exist on {target.host} (sacctmgr); set spec.account to "
                      f"{own}",
        "no_association": f"{who} has no association with account {target.account} on {target.host} (sacctmgr): "
                          f"ask its admins to add one, or set spec.account to {own}",
    }.get(answer.account)
    return PreflightFailure(field="account", message=message) if message else None


def _python(answer: PreflightAnswer, target: PreflightTarget) -> PreflightFailure | None:
    fix = ("set spec.scheduler.python to the login node's Python 3.9 or later (a name on its PATH or an absolute "
           "path): the run-dir probe runs it")
    where = f"scheduler.python {target.python} on {target.host}"
    if answer.python == "missing":
        return PreflightFailure(field="scheduler.python", message=f"{where} was not found; {fix}")
    if answer.python == "failed":
        return PreflightFailure(field="scheduler.python", message=f"{where} does not run "
                                                                  f"({answer.python_error}); {fix}")
    if answer.python == "ok" and _version(answer.python_version) < MIN_PYTHON:
        return PreflightFailure(field="scheduler.python", message=f"{where} is Python {answer.python_version}; {fix}")
    return None


def _version(text: str) -> tuple[int, ...]:
    """'3.11' → (3, 11); anything else reads as too old (never passed on a guess)."""
    major, _, minor = text.partition(".")
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else (0,)


def _passed(answer: PreflightAnswer, target: PreflightTarget) -> tuple[str, ...]:
    notes = {
        "jobs dir": {"ok": f"jobs dir {target.jobs_dir} writable",
                     "creatable": f"jobs dir {target.jobs_dir} made by the first job ({answer.jobs_dir_parent} is "
                                  "writable)",
                     "skipped": "jobs dir a URL (not checked here)"}.get(answer.jobs_dir),
        "script": f"job script {target.job_script} readable" if answer.script == "ok" else None,
        "partition": f"partition {target.partition}" if answer.partition == "ok" else None,
        "account": {"ok": f"account {target.account}",
                    "unknown": f"account {target.account} not checked (sacctmgr: {answer.account_error or 'failed'})"
                    }.get(answer.account),
        "python": (f"python {answer.python_version}" if answer.python == "ok"
                   and _version(answer.python_version) >= MIN_PYTHON else None),
    }
    return tuple(note for note in notes.values() if note)
