"""The one masker: token shapes whoever set them, this process's secret variables, the cluster's secrets.

What it must not do matters as much: mask ordinary words (a log full of `***` hides the diagnosis), or take
quadratic time on a job's hostile output (it runs on every read of every running job).
"""

from __future__ import annotations

import io
import secrets
import string
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controller.adapters.secrets import MaskedStream, SecretMask, ambient_secrets, looks_secret, mask_text
from controller.core.notify import DeliveryState, Notification, NotifyEvent
from controller.core.types import EvalRunRef
from controller.entry.webhooks import slack_body

ALNUM = string.ascii_letters + string.digits


def _random(n: int, alphabet: str = ALNUM) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


SHAPED = [  # (token, what it becomes)
    (f"hf_{_random(34)}", "hf_***"),
    (f"sk-{_random(47)}1", "sk-***"),
    (f"sk-proj-{_random(40, ALNUM + '_-')}7", "sk-proj-***"),
    (f"sk-ant-api03-{_random(90, ALNUM + '_-')}5", "sk-ant-***"),
    *[(f"{prefix}{_random(36)}", f"{prefix}***") for prefix in ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")],
    (f"github_pat_{_random(22)}_{_random(59)}", "github_pat_***"),
    *[(f"xox{kind}-{_random(11, string.digits)}-{_random(24)}", f"xox{kind}-***") for kind in "abposr"],
    (f"https://hooks.slack.com/services/T{_random(8)}/B{_random(8)}/{_random(24)}", "https://hooks.slack.com/services/***"),
    (f"AKIA{_random(16, string.ascii_uppercase + string.digits)}", "AKIA***"),
    (f"ASIA{_random(16, string.ascii_uppercase + string.digits)}", "ASIA***"),
    ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "***"),
    (f"Bearer {_random(40)}", "Bearer ***"),
    (f"bearer {_random(6)}42", "bearer ***"),
    (f"Authorization: Bearer {_random(30)}", "Authorization: Bearer ***"),
    ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "Authorization: Basic ***"),
    (f'"authorization": "token {_random(12)}9"', '"authorization": "token ***"'),
    (f"Proxy-Authorization: {_random(10)}3", "Proxy-Authorization: ***"),
]
ORDINARY = [
    "tokenizer loaded: Qwen/Qwen3-8B (use_fast=True, TOKENIZERS_PARALLELISM=false)",
    "KEY_COLUMN=id; primary key (id) on the keys table",
    "the Bearer token was rejected: Bearer authentication needs a token",
    "Authorization: required; authorization failed for user alice",
    "pip install sk-learn-compatible-estimators scikit-learn",
    "hf_hub_download(repo_id='org/model', filename='config.json') from hf_transfer",
    "task-0123456789abcdefghijklmnop__a1 commit 3e60722a02f14dd2b4ad0a7c9b1e5d6f8a9b0c1d",
    "run 7c9e6679-7425-40de-944b-e07fc1f90ae7 on node gpu[01-04] at 2026-11-29T14:15:12",
    "ASIAPACIFIC region; AKIAS short; eyJ alone; xoxo-hugs; ghp_short",
    "INFO:     127.0.0.1:51234 - \"POST /v1/chat/completions HTTP/1.1\" 200 OK",
]


@pytest.mark.parametrize(("token", "masked"), SHAPED, ids=[m.split("*")[0] or "jwt" for _, m in SHAPED])
def test_every_token_shape_is_masked_keeping_the_prefix_that_names_its_kind(token: str, masked: str) -> None:
    assert mask_text(f"before {token} after") == f"before {masked} after"
    assert mask_text(f"'{token}'\n") == f"'{masked}'\n", "quoted, at a line end"
    assert mask_text(f"X={token}") == f"X={masked}"


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_words_are_left_alone(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEY_COLUMN", "id")  # too short to be anything but a word
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    assert mask_text(text) == text


def test_this_processs_secret_variables_are_masked_and_its_settings_are_not(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    site, db = f"site-{secrets.token_hex(12)}", "correct horse battery staple"
    monkeypatch.setenv("SITE_API_KEY", site)  # no known shape: its name says what it is
    monkeypatch.setenv("db_password", db)  # names are read case-insensitively, values may hold spaces
    monkeypatch.setenv("EVALCTL_SECRET_X_Y", "tok9")  # a CLI secret: the referenced secrets' shorter floor
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path))  # a path that exists: where a secret is, not one
    monkeypatch.setenv("MAX_TOKENS", "4096")
    monkeypatch.setenv("OPENAI_KEY_ID", "   ")
    assert {site, db, "tok9"} <= ambient_secrets()
    assert not {str(tmp_path), "4096", "   "} & ambient_secrets()
    text = f"key {site}, password {db}, tok9, {tmp_path}, max 4096"
    assert mask_text(text) == f"key ***, password ***, ***, {tmp_path}, max 4096"


@pytest.mark.parametrize(("name", "value", "secret"), [
    ("HF_TOKEN", "hf_x", True), ("OPENAI_API_KEY", "abc", True), ("KEY_COLUMN", "id", True),
    ("AWS_SECRET_ACCESS_KEY", "/wJalrXUtnFEMI/K7MDENG", True), ("PGPASSWORD", "pw", True),
    ("TOKENIZERS_PARALLELISM", "false", False), ("USE_KEYRING", "Yes", False), ("MAX_TOKENS", "4096", False),
    ("KEY_VERSION", "1.2.3", False), ("HF_TOKEN_PATH", "/", False), ("SECRET", "", False), ("PATH", "/usr/bin", False),
    ("HOME", "hf_" + "x" * 40, False),
])
def test_what_looks_secret(name: str, value: str, secret: bool) -> None:
    assert looks_secret(name, value) is secret


def test_values_are_masked_longest_first_then_shapes() -> None:
    mask = SecretMask(values=["abcd1234", "abcd1234efgh5678", "xy"])
    assert mask("k=abcd1234efgh5678 j=abcd1234 xy") == "k=*** j=*** xy", "a value containing another goes whole"
    hf = f"hf_{_random(34)}"
    assert SecretMask(values=[hf])(f"got {hf}") == "got ***", "a referenced secret is masked as a value"


def test_job_output_is_withheld_without_a_referenced_secret_and_other_text_is_still_masked() -> None:
    mask = SecretMask(values=["abcd1234"], unavailable=["set EVALCTL_SECRET_HF_TOKEN"])
    token = f"ghp_{_random(36)}"
    assert "withheld" in mask(f"abcd1234 {token}") and token not in mask(token)
    assert mask.known(f"abcd1234 {token}") == "*** ghp_***", "a reason or a name is masked, never withheld"
    assert mask("") == ""


@pytest.mark.parametrize("unit", ["eyJ", "eyJaaaaaaaa.", "bearer ", "Authorization: ", "hf_", "sk-", "sk-a", "-sk-a1",
                                  "AKIA", "xoxb-", "https://hooks.slack.com/services/", "a", " "])
def test_hostile_output_costs_linear_time(unit: str) -> None:
    """A job can print anything, a megabyte a pass: no input makes the scan backtrack over what it has seen."""
    text = unit * ((1 << 20) // len(unit))
    started = time.perf_counter()
    mask_text(text)
    assert time.perf_counter() - started < 2.0


def test_what_leaves_the_process_is_masked_there_too(monkeypatch: pytest.MonkeyPatch) -> None:
    token = f"xoxp-{_random(30)}"
    stream = io.StringIO()
    masked = MaskedStream(stream)  # type: ignore[arg-type]
    masked.write(f"status {token}\n")
    masked.writelines([f"{token}\n"])
    assert stream.getvalue() == "status xoxp-***\nxoxp-***\n" and masked.getvalue() == stream.getvalue()
    notification = Notification(id="n1", evalrun=EvalRunRef(name="e"), webhook="team", subject="cell", label="m × b",
                                event=NotifyEvent.FAILED, episode=1, detail=f"job said {token}",
                                state=DeliveryState.PENDING, created_at=datetime.now(UTC))
    assert token not in str(slack_body(notification)) and "xoxp-***" in slack_body(notification)["text"]
