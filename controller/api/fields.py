"""The building blocks of the API types: bounds, validated strings and numbers, secret references, object metadata.

camelCase in YAML (Kubernetes convention), snake_case in Python. Unknown fields are errors and every field carries a
description, which becomes `kubectl explain` text in the generated CRDs. Defaults are the ones docs/RULES.md
documents.

Validators that reject one entry of a list or one key of a map raise `PydanticCustomError` with `ctx["at"]` = the
location below the field (an index, a key, `"[key]"` for the key itself), so the loader can point at that entry
instead of at the whole field.

Every number and string is bounded, so a typo or a hostile value is refused by `validate` with its position instead
of failing later in timedelta, the kernel (argv/environment size) or the file system.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from controller.core.types import walltime_seconds

API_VERSION = "evalrun.io/v1alpha1"

HOURS_MAX = 8_760  # a year: any staleness threshold beyond it is a typo
MINUTES_MAX = 525_600  # a year, in minutes
TIME_LIMIT_MAX_DAYS = 365
NAME_MAX = 253  # DNS-1123 subdomain, the longest Kubernetes name
SHORT_MAX = 64  # agents, presets, SLURM partition/account/QOS names, usernames
PATH_MAX = 4_096  # Linux PATH_MAX
URL_MAX = 2_048
# Model and dataset reach argv, the environment, the results DB and (slugged, cut to 64) the run tag.
MODEL_MAX = 200  # Hugging Face repo ids have at most 96 characters; local checkpoint paths a few more
DATASET_MAX = 256
# Jobs get the cluster's env and EVAL_AGENT_KWARGS (JSON) in their environment: Linux refuses one string
# over 128 KiB (MAX_ARG_STRLEN) and argv + environment over 2 MiB, and the job inherits ours on top.
ENV_NAME_MAX = 128
ENV_VALUE_MAX = 32 * 1024
ENV_TOTAL_MAX = 256 * 1024
ENV_ENTRIES_MAX = 256
AGENT_KWARGS_MAX = 64
AGENT_KWARGS_BYTES = 32 * 1024
MODELS_MAX = 1_000
DATASETS_MAX = 1_000
PRESETS_MAX = 32
POOL_MAX = 1_000  # pinggy pairs, secretEnv entries
INVISIBLE = {"Cc", "Cf", "Cs", "Zl", "Zp"}  # control, format (zero-width, bidi), surrogate, line/paragraph breaks

DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SECRET_LOOKING_ENV = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|PRIVATE_KEY|CREDENTIAL)", re.IGNORECASE)
WALLTIME = re.compile(r"(\d+-)?\d{1,3}:[0-5]\d:[0-5]\d|\d+")
SSH_HOST = re.compile(r"[^\s-]\S*")  # never a leading '-': the host is in ssh's argv, where it would be an option


def walltime_text(value: str, name: str) -> str:
    """SLURM walltime syntax, at most TIME_LIMIT_MAX_DAYS days."""
    if not WALLTIME.fullmatch(value):
        raise ValueError(f'{name} {value!r} must look like HH:MM:SS, D-HH:MM:SS or minutes, e.g. "24:00:00"')
    if walltime_seconds(value) > TIME_LIMIT_MAX_DAYS * 86_400:
        raise ValueError(f"{name} is longer than {TIME_LIMIT_MAX_DAYS} days; write a real walltime, e.g. \"24:00:00\"")
    return value


def visible(value: str) -> str:
    """Names reach argv, file names, the environment and the store: an invisible character breaks or spoofs them."""
    bad = next((char for char in value if unicodedata.category(char) in INVISIBLE), None)
    if bad is not None:
        raise ValueError(f"holds the control or invisible character U+{ord(bad):04X}; remove it")
    return value


def _env_name(value: str) -> str:
    """A name the job's environment can carry and a shell can read: no '=', no NUL, no spaces."""
    if not ENV_NAME.fullmatch(value):
        raise ValueError("must be an environment variable name: letters, digits and '_', not starting with a digit")
    return value


def ssh_host(value: str) -> str:
    """A login host as ssh takes it, never something ssh would read as an option."""
    if not SSH_HOST.fullmatch(value):
        raise ValueError("must be host, user@host or user@host:port, without spaces and not starting with '-' "
                         "(ssh would read it as an option)")
    return value


def _env_value(value: str) -> str:
    """An environment string cannot hold NUL, nor a lone surrogate (it cannot be encoded)."""
    if "\0" in value or any(unicodedata.category(char) == "Cs" for char in value):
        raise ValueError("holds a NUL or an unpaired surrogate character, which an environment variable cannot carry")
    return value


ARGUMENT_UNSAFE = re.compile(r"^-|[\s'\"`;$]")
ARGUMENT_SAFE_PATTERN = r"^[^\s'\"`;$-][^\s'\"`;$]*$"  # the same rule for the CRD schema


def _argument_safe(value: str) -> str:
    """Model and dataset reach the job script's argv: never an option, nothing a shell would act on."""
    if ARGUMENT_UNSAFE.search(value):
        raise ValueError("must not start with '-' nor hold whitespace, quotes, ';', '$' or backticks: it is an "
                         "argument of the job script")
    return value


REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+")  # Hugging Face: Org/Name
URL_LIKE = ("hf:", "http:", "https:", "huggingface.co/", "www.huggingface.co/", "hf.co/")


def _not_a_url(value: str, example: str) -> None:
    if "://" in value or value.lower().startswith(URL_LIKE):
        raise ValueError(f"is a URL; name it by its Hugging Face repo id, Org/Name, e.g. {example}")


def _model_name(value: str) -> str:
    """A model is a Hugging Face repo id, or an absolute path to a local checkpoint: anything else (a URL, a tag, a
    name without its org) is a job that fails in the queue after its wait, so it is refused here."""
    _not_a_url(value, "Qwen/Qwen3-8B")
    if value.startswith("/"):
        return value
    if ":" in value:
        raise ValueError("names a tag or revision (':'); write the repo id alone, Org/Name, e.g. Qwen/Qwen3-8B")
    if "/" not in value:
        raise ValueError(f"has no organisation; write Org/Name, e.g. <org>/{value}")
    if not REPO_ID.fullmatch(value):
        raise ValueError("must be a Hugging Face repo id, Org/Name (one '/'; letters, digits, '.', '_', '-'), e.g. "
                         "Qwen/Qwen3-8B, or an absolute path to a local checkpoint")
    return value


def _dataset_name(value: str) -> str:
    """A Hugging Face dataset id (Org/name) or a local directory; its last '/' segment is the benchmark's name in the
    results DB and in the run tag, so it must exist."""
    _not_a_url(value, "DCAgent2/terminal_bench_2")
    if not value.strip("/"):
        raise ValueError("names no dataset: its last '/' segment is the benchmark name; write e.g. Org/bench_name")
    if "/" not in value:
        raise ValueError(f"has no organisation; write Org/{value} (a Hugging Face dataset), or ./{value} for a "
                         "local directory")
    return value


Hours = Annotated[float, Field(ge=0, le=HOURS_MAX)]
Minutes = Annotated[float, Field(ge=0, le=MINUTES_MAX)]
PositiveInt = Annotated[int, Field(gt=0)]
Name = Annotated[str, Field(min_length=1, max_length=NAME_MAX), AfterValidator(visible)]
Short = Annotated[str, Field(min_length=1, max_length=SHORT_MAX), AfterValidator(visible)]
PathText = Annotated[str, Field(min_length=1, max_length=PATH_MAX), AfterValidator(visible)]
NamespaceName = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
EnvName = Annotated[str, Field(min_length=1, max_length=ENV_NAME_MAX), AfterValidator(_env_name)]
EnvValue = Annotated[str, Field(max_length=ENV_VALUE_MAX), AfterValidator(_env_value)]
Walltime = Annotated[str, Field(max_length=32), AfterValidator(lambda value: walltime_text(value, "walltime"))]
# The CRD's schema refuses what _argument_safe refuses (the API server never stores it); here the loader says why.
SAFE_SCHEMA = {"pattern": ARGUMENT_SAFE_PATTERN}
Model = Annotated[str, Field(min_length=1, max_length=MODEL_MAX, json_schema_extra=SAFE_SCHEMA),
                  AfterValidator(visible), AfterValidator(_argument_safe), AfterValidator(_model_name)]
Dataset = Annotated[str, Field(min_length=1, max_length=DATASET_MAX, json_schema_extra=SAFE_SCHEMA),
                    AfterValidator(visible), AfterValidator(_argument_safe), AfterValidator(_dataset_name)]


RESERVED_ENV = ("{what} {name} is a name the reconciler or the scheduler sets for every job (the EVAL_* contract "
                "of RULES §7, SLURM_*), and would be overridden; remove it, or name your variable differently")


def entry_error(at: tuple[str | int, ...], kind: str, message: str, **ctx: Any) -> PydanticCustomError:
    """A validation error that points at `at` below the validated field (see module docstring)."""
    return PydanticCustomError(kind, message, {"at": at, **ctx})


def first_duplicate(values: list[str]) -> int | None:
    seen: set[str] = set()
    for index, value in enumerate(values):
        if value in seen:
            return index
        seen.add(value)
    return None


class SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True,
                              allow_inf_nan=False)


class SecretRef(SpecModel):
    """Where a secret lives: a Kubernetes Secret, or for the CLI an environment variable named after it."""

    name: Name = Field(
        description="Secret name; the CLI reads env var EVALCTL_SECRET_<NAME>_<KEY> (upper, '-'→'_')."
    )
    key: Name = Field("token", description="Key inside the secret.")


class SecretEnv(SpecModel):
    """One secret environment variable for the job, by reference only."""

    name: EnvName = Field(description="Environment variable the job receives.")
    secret_ref: SecretRef = Field(description="Where its value comes from; never written inline.")


class ObjectMeta(SpecModel):
    """Kubernetes object metadata; fields the API server adds are accepted and ignored."""

    model_config = ConfigDict(extra="allow", frozen=True, alias_generator=to_camel, populate_by_name=True)

    name: str = Field(max_length=NAME_MAX, description="Resource name (DNS-1123).")
    namespace: str | None = Field(None, description="Kubernetes namespace (operator only).")
    generation: int | None = Field(None, description="Set by the API server.")
    labels: dict[str, str] = Field(default_factory=dict, description="Kubernetes labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="e.g. evalrun.io/requestedAt")

    @field_validator("name")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        if not DNS_NAME.match(value) or len(value) > 253:
            raise ValueError(f"name {value!r} must be lowercase letters, digits, '-' or '.' (DNS-1123)")
        return value
