"""Masking secrets out of text that comes from jobs, as the adapter that reads it reads it.

A job may print a key: the one its cluster gave it, one it found (a token file, a hard-coded one), or one its
submitter's environment held. What shows that text (status, plan -o json, explain, Events, the report, webhooks, the
store, MLflow) often runs without the secrets, so masking at print time with "the secrets this process happens to
hold" leaks. One mask per cluster hides, in every log tail, output line, scheduler reason and run-dir name it is
given:

- every secret the cluster references (`values`); when one of them is not available here, job output is withheld
  rather than shown unmasked;
- the values of this process's secret variables (`ambient_secrets`): EVALCTL_SECRET_*, and every variable named like
  a secret (TOKEN, KEY, SECRET, PASSWORD) holding what could be one;
- well-known token shapes, whoever set them (`SHAPES`): Hugging Face, OpenAI, Anthropic, GitHub, Slack tokens and
  webhook URLs, AWS access key ids, JWTs, `Bearer` and `Authorization:` values.

A value is replaced whole by `***`; a shape keeps the prefix that names its kind (`hf_***`, `sk-ant-***`, `ghp_***`,
`xoxb-***`, `AKIA***`, `Bearer ***`; a JWT, which has none, becomes `***`), so a reader still knows what leaked.
`mask_text` (ambient values and shapes) is the last line of defence where text leaves the process.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TextIO

from controller.core.ports import ObservationError

SECRET_VARIABLES = "EVALCTL_SECRET_"
MIN_SECRET_LENGTH = 4  # a referenced secret: shorter values would mask ordinary words; no real token is that short
MIN_AMBIENT_LENGTH = 8  # a variable only named like a secret: `KEY_COLUMN=id` must not mask every "id"
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD", re.IGNORECASE)
_SWITCH_OR_NUMBER = re.compile(r"(?i:true|false|yes|no|on|off|none|null)|[-+.0-9]+")  # a number, a version

# Each token shape starts where a word does (the look-behind), so a run of token characters is tried once, and no
# part of a pattern can backtrack into another's run: a scan is linear in the text. A credential after `Bearer` or
# `Authorization:` must hold a digit or be 20 characters long: "Bearer authentication" is prose, not a token.
_CREDENTIAL = r"(?:(?=[A-Za-z._~+/=-]*[0-9])[A-Za-z0-9._~+/=-]{8,}|[A-Za-z0-9._~+/=-]{20,})"
_WITH_DIGIT = r"(?=[A-Za-z_-]*[0-9])"  # `sk-learn-compatible-estimator` is a name, an OpenAI key has digits
SHAPES = re.compile(
    r"(?<![A-Za-z0-9_-])(?:"
    r"(?P<hf>hf_)[A-Za-z0-9]{30,}"
    rf"|(?P<anthropic>sk-ant-){_WITH_DIGIT}[A-Za-z0-9_-]{{20,}}"
    rf"|(?P<openai>sk-(?:proj-)?){_WITH_DIGIT}[A-Za-z0-9_-]{{20,}}"
    r"|(?P<github>gh[pousr]_)[A-Za-z0-9]{36,}"
    r"|(?P<github_pat>github_pat_)[A-Za-z0-9_]{60,}"
    r"|(?P<slack>xox[abposr]-)[A-Za-z0-9-]{10,}"
    r"|(?P<slack_webhook>https://hooks\.slack\.com/services/)[A-Za-z0-9/_-]+"
    r"|(?P<aws>AKIA|ASIA)[0-9A-Z]{16}(?![A-Za-z0-9])"
    r"|(?P<jwt>)eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
    r")"
    r"|(?<![A-Za-z0-9])(?:"  # headers: `Proxy-Authorization:` too
    rf"(?P<authorization>(?i:authorization)[\"']?[ \t]*[:=][ \t]*[\"']?(?:(?i:basic|bearer|token)[ \t]+)?){_CREDENTIAL}"
    rf"|(?P<bearer>(?i:bearer)[ \t]+){_CREDENTIAL}"
    r")"
)


def looks_secret(name: str, value: str) -> bool:
    """A variable named like a secret holding what could be one: not blank, a switch, a number, or a path that exists
    here (`TOKENIZERS_PARALLELISM=false` and `HF_TOKEN_PATH=/run/secrets/hf` are settings, not secrets). The ssh
    runner applies the same rule on the login node (`remote.ssh.DROP_SECRETS`)."""
    if not SECRET_NAME.search(name):
        return False
    text = value.strip()
    return bool(text) and not _SWITCH_OR_NUMBER.fullmatch(text) and not (text.startswith("/") and os.path.exists(text))


def ambient_secrets(environ: Mapping[str, str] = os.environ) -> set[str]:
    """The values of this process's secret variables: EVALCTL_SECRET_* (the CLI's secrets), and the variables that
    `looks_secret`, those long enough not to be an ordinary word."""
    return {value for name, value in environ.items()
            if (name.startswith(SECRET_VARIABLES) and len(value) >= MIN_SECRET_LENGTH)
            or (len(value) >= MIN_AMBIENT_LENGTH and looks_secret(name, value))}


def _kind_kept(match: re.Match[str]) -> str:
    return f"{match[match.lastgroup] if match.lastgroup else ''}***"


class SecretMask:
    """Callable: job output → the same text with every secret value and token shape masked, or withheld."""

    def __init__(self, values: Iterable[str] = (), unavailable: Iterable[str] = ()) -> None:
        """`values`: the secrets the cluster references; `unavailable`: how to provide each one this process does
        not have. The environment's secrets are read now."""
        held = {v for v in values if len(v) >= MIN_SECRET_LENGTH} | ambient_secrets()
        self._values = sorted(held, key=len, reverse=True)  # longest first: a secret containing another
        self._unavailable = sorted(set(unavailable))

    def __call__(self, text: str) -> str:
        """A job's output: masked, or withheld whole when a secret it may print is not here to be masked."""
        if text and self._unavailable:
            return ("(job output withheld: it cannot be masked without every secret its cluster references; "
                    f"{'; '.join(self._unavailable)}, or read the job's log file)")
        return self.known(text)

    def known(self, text: str) -> str:
        """Masked with what this process knows, never withheld: for what a job only shapes (the names in its run
        dir, a scheduler's reason, a command's error line), where withholding would hide what the rules need."""
        if not text:
            return text
        for value in self._values:
            text = text.replace(value, "***")
        return SHAPES.sub(_kind_kept, text)


@contextmanager
def masking_errors(mask: SecretMask) -> Iterator[None]:
    """An ObservationError leaving the block says what it said, masked: it may quote what a job wrote (a state file
    of the local scheduler, a line of output that broke the read, the probe's error), and it becomes a reason."""
    try:
        yield
    except ObservationError as exc:
        said = mask.known(str(exc))
        if said == str(exc):
            raise
        raise type(exc)(said) from None  # the unmasked one not chained: a traceback would print it


def mask_text(text: str) -> str:
    """This process's secrets and every token shape masked: what leaves the process (CLI output, the report, a
    webhook) passes this whatever it passed before."""
    return SecretMask().known(text)


class MaskedStream:
    """A text stream (stdout, stderr) whose writes pass `mask_text`; everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(mask_text(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
