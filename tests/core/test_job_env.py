"""The job's environment comes from one builder: the contract's EVAL_* values win over the cluster's env and secrets."""

from __future__ import annotations

import pytest

from controller.core.actions import Resume, Submit
from controller.core.job_env import (
    CONTRACT_NAMES,
    SERVING_NAMES,
    JobSecrets,
    JobSettings,
    is_reserved,
    job_environment,
)
from controller.core.types import Cell, Serving
from tests.core.builders import cell

C = cell(conda_env="otagent2", max_model_len=32768)
TAG = C.run_tag(1)
SUBMIT = Submit(run_tag=TAG, attempt=1, reason="r")
RESUME = Resume(run_tag=TAG, attempt=1, fire=3, reason="r", tunnel="pair-1")
SETTINGS = JobSettings(jobs_dir="/work/jobs", username="alice", gpu_memory_util=0.85, infra_error_threshold=10,
                       env={"HF_HOME": "/work/hf", "EVAL_JOBS_DIR": "/elsewhere", "SHARED": "cluster"})
SECRETS = JobSecrets(env={"DAYTONA_API_KEY": "d-key", "SHARED": "secret", "EVAL_DB_JOB_ID": "forged"},
                     pinggy_url="https://p1.a.pinggy.link", pinggy_token="p-token")

# (variable, launch, expected value): who wins where two layers set the same name.
PRECEDENCE = [
    ("HF_HOME", SUBMIT, "/work/hf"),  # only the cluster sets it
    ("DAYTONA_API_KEY", SUBMIT, "d-key"),  # only a secret sets it
    ("SHARED", SUBMIT, "secret"),  # a secret over the cluster's plain env
    ("EVAL_JOBS_DIR", SUBMIT, "/work/jobs"),  # the contract over the cluster's env
    ("EVAL_DB_JOB_ID", SUBMIT, "row-7"),  # the contract over a secret
    ("EVAL_RESUME", SUBMIT, "0"),
    ("EVAL_RESUME_COUNT", SUBMIT, "0"),
    ("EVAL_RESUME", RESUME, "1"),
    ("EVAL_RESUME_COUNT", RESUME, "2"),  # the third job on the dir is its second resume
    ("EVAL_PINGGY_URL", RESUME, "https://p1.a.pinggy.link"),
    ("EVAL_PINGGY_TOKEN", RESUME, "p-token"),
    ("EVAL_PINGGY_TOKEN", SUBMIT, None),  # no pair leased: no tunnel variables at all
    ("EVAL_CONDA_ENV", SUBMIT, "otagent2"),  # from the model registry, through the cell
    ("EVAL_VLLM_MAX_MODEL_LEN", SUBMIT, "32768"),
    ("EVAL_VLLM_TENSOR_PARALLEL_SIZE", SUBMIT, None),  # unset in the registry: not passed
    ("EVAL_UPLOAD_USERNAME", SUBMIT, "alice"),
    ("EVAL_GPU_MEMORY_UTIL", SUBMIT, "0.85"),
    ("EVAL_DAYTONA_THRESHOLD", SUBMIT, "10"),
    ("EVAL_AGENT_KWARGS", SUBMIT, "[]"),
    ("EVAL_SHARD", SUBMIT, None),  # not a shard: the whole dataset
]


@pytest.mark.parametrize(("name", "launch", "expected"), PRECEDENCE,
                         ids=[f"{n}-{type(launch).__name__}" for n, launch, _ in PRECEDENCE])
def test_precedence(name: str, launch: Submit | Resume, expected: str | None) -> None:
    assert job_environment(C, launch, "row-7", SETTINGS, SECRETS).get(name) == expected


def test_every_contract_name_the_builder_sets_is_reserved() -> None:
    built = job_environment(C, RESUME, "row-7", SETTINGS, SECRETS)
    contract = {name for name in built if name.startswith("EVAL_")}
    assert contract <= CONTRACT_NAMES, "a name the builder sets that validate would not refuse"
    assert all(is_reserved(name) for name in contract)


@pytest.mark.parametrize(("name", "reserved"), [
    ("EVAL_JOBS_DIR", True), ("EVAL_JOB_ID", True), ("EVAL_SHARD", True), ("SLURM_JOB_ID", True), ("SLURM_ANYTHING", True),
    ("EVAL_ENV", False), ("EVAL_HARBOR_CONFIG_DIR", False), ("HF_HOME", False),
])
def test_reserved_names_are_the_contracts_and_the_schedulers(name: str, reserved: bool) -> None:
    assert is_reserved(name) is reserved


SERVED = cell(serving=Serving(pattern="tool_calls", tool_call_parser="hermes", extra_args="--seed 42",
                              trust_remote_code=True, max_retries=30), config_yaml="dcagent_eval_config_swe_agent.yaml")


@pytest.mark.parametrize(("served", "name", "expected"), [
    (SERVED, "EVAL_VLLM_TOOL_CALL_PARSER", "hermes"),
    (SERVED, "EVAL_VLLM_EXTRA_ARGS", "--seed 42"),
    (SERVED, "EVAL_VLLM_TRUST_REMOTE_CODE", "1"),
    (SERVED, "EVAL_VLLM_MAX_RETRIES", "30"),
    (SERVED, "EVAL_CONFIG_YAML", "dcagent_eval_config_swe_agent.yaml"),
    (SERVED, "EVAL_VLLM_REASONING_PARSER", None),  # unset in the recipe: no variable, so the script adds no flag
    (SERVED, "EVAL_VLLM_ENFORCE_EAGER", None),  # a switch that is off is absent too
    (C, "EVAL_VLLM_TOOL_CALL_PARSER", None),
    (C, "EVAL_CONFIG_YAML", None),
])
def test_the_serving_recipe_reaches_the_job(served: Cell, name: str, expected: str | None) -> None:
    env = job_environment(served, SUBMIT, "row-7", SETTINGS, JobSecrets())
    assert env.get(name) == expected


def test_a_cluster_cannot_set_a_serving_variable() -> None:
    assert all(is_reserved(name) for name in SERVING_NAMES)
