"""The environment a job script receives (RULES §7): our contract with sbatch scripts, built in one place.

Precedence, lowest first: the cluster's `env`, its `secretEnv`, what a remedy adds to a refire (e.g.
`EVAL_CLEAR_COMPILE_CACHE=1`), then the contract's `EVAL_*` values, which always win. `validate` refuses a
cluster whose `env` or `secretEnv` sets a reserved name, so a contract value is never overridden silently,
and the last layer only guards against a spec that skipped validation.
Schedulers add the job's own id when they know it (`SLURM_JOB_ID`; the local scheduler also `EVAL_JOB_ID`).
Pure: the secrets arrive as values read at submit time, and what this returns is never logged.
"""

from __future__ import annotations

import json

from pydantic import Field

from controller.core.actions import Launch, Resume
from controller.core.types import Cell, Frozen, Serving

# The serving recipe of the cell's harness pattern (RULES §10), one variable per vLLM setting; each is set only
# when the recipe sets it, and the job script adds a flag only for a non-empty one.
SERVING_NAMES = (
    "EVAL_VLLM_TOOL_CALL_PARSER", "EVAL_VLLM_REASONING_PARSER", "EVAL_VLLM_CHAT_TEMPLATE", "EVAL_VLLM_EXTRA_ARGS",
    "EVAL_VLLM_TRUST_REMOTE_CODE", "EVAL_VLLM_SWAP_SPACE", "EVAL_VLLM_ENFORCE_EAGER", "EVAL_VLLM_MAX_RETRIES",
)
# Every name the contract gives a meaning, set here or by a scheduler: a cluster must not set one of them.
CONTRACT_NAMES = frozenset({
    "EVAL_N_CONCURRENT", "EVAL_N_ATTEMPTS", "EVAL_GPU_MEMORY_UTIL", "EVAL_DAYTONA_THRESHOLD", "EVAL_AGENT_NAME",
    "EVAL_AGENT_KWARGS", "EVAL_JOBS_DIR", "EVAL_TIMEOUT_MULTIPLIER", "EVAL_CONFIG_YAML", "EVAL_HARBOR_CONFIG",
    "EVAL_MAX_OUTPUT_TOKENS", "EVAL_VLLM_TENSOR_PARALLEL_SIZE", "EVAL_VLLM_DATA_PARALLEL_SIZE",
    "EVAL_VLLM_MAX_MODEL_LEN", "EVAL_CONDA_ENV", "EVAL_PINGGY_URL", "EVAL_PINGGY_TOKEN", "EVAL_DB_JOB_ID",
    "EVAL_UPLOAD_USERNAME", "EVAL_RESUME", "EVAL_RESUME_COUNT", "EVAL_JOB_ID", "EVAL_CLEAR_COMPILE_CACHE",
    "EVAL_SHARD", *SERVING_NAMES,
})
SCHEDULER_PREFIX = "SLURM_"  # the scheduler's own variables: a job that inherits a forged one misreads itself


def is_reserved(name: str) -> bool:
    return name in CONTRACT_NAMES or name.startswith(SCHEDULER_PREFIX)


class JobSettings(Frozen):
    """What a cluster and its EvalRun give every job, besides the cell."""

    jobs_dir: str
    username: str
    gpu_memory_util: float
    infra_error_threshold: int
    env: dict[str, str] = Field(default_factory=dict, description="the cluster's extra, non-secret env")


class JobSecrets(Frozen):
    """Secret values for one launch, read at submit time (a missing one fails that submission, not the pass)."""

    env: dict[str, str] = Field(default_factory=dict, description="the cluster's secretEnv, by variable name")
    pinggy_url: str | None = None
    pinggy_token: str | None = None


def serving_environment(serving: Serving) -> dict[str, str | int | None]:
    """The vLLM recipe as the job's variables; a switch that is off is absent, as an unset setting is."""
    return {
        "EVAL_VLLM_TOOL_CALL_PARSER": serving.tool_call_parser,
        "EVAL_VLLM_REASONING_PARSER": serving.reasoning_parser,
        "EVAL_VLLM_CHAT_TEMPLATE": serving.chat_template,
        "EVAL_VLLM_EXTRA_ARGS": serving.extra_args,
        "EVAL_VLLM_TRUST_REMOTE_CODE": "1" if serving.trust_remote_code else None,
        "EVAL_VLLM_SWAP_SPACE": serving.swap_space,
        "EVAL_VLLM_ENFORCE_EAGER": "1" if serving.enforce_eager else None,
        "EVAL_VLLM_MAX_RETRIES": serving.max_retries,
    }


def job_environment(cell: Cell, launch: Launch, row_id: str, settings: JobSettings,
                    secrets: JobSecrets) -> dict[str, str]:
    contract = {
        "EVAL_N_CONCURRENT": str(cell.n_concurrent),
        "EVAL_N_ATTEMPTS": str(cell.n_attempts),
        "EVAL_GPU_MEMORY_UTIL": f"{settings.gpu_memory_util:g}",
        "EVAL_DAYTONA_THRESHOLD": str(settings.infra_error_threshold),
        "EVAL_AGENT_NAME": cell.agent,
        "EVAL_AGENT_KWARGS": json.dumps(list(cell.agent_kwargs)),
        "EVAL_JOBS_DIR": settings.jobs_dir,
        "EVAL_TIMEOUT_MULTIPLIER": f"{cell.timeout_multiplier:g}",
        "EVAL_HARBOR_CONFIG": cell.harbor_config,
        "EVAL_UPLOAD_USERNAME": settings.username,
        "EVAL_DB_JOB_ID": row_id,
        "EVAL_RESUME": "1" if isinstance(launch, Resume) else "0",
        "EVAL_RESUME_COUNT": str(launch.fire - 1),
    }
    optional = {
        "EVAL_MAX_OUTPUT_TOKENS": cell.max_output_tokens,
        "EVAL_VLLM_TENSOR_PARALLEL_SIZE": cell.tensor_parallel_size,
        "EVAL_VLLM_DATA_PARALLEL_SIZE": cell.data_parallel_size,
        "EVAL_VLLM_MAX_MODEL_LEN": cell.max_model_len,
        "EVAL_CONDA_ENV": cell.conda_env,
        "EVAL_CONFIG_YAML": cell.config_yaml,
        "EVAL_SHARD": str(cell.shard) if cell.shard is not None else None,
        **serving_environment(cell.serving),
    }
    if launch.tunnel is not None:
        optional |= {"EVAL_PINGGY_URL": secrets.pinggy_url or "", "EVAL_PINGGY_TOKEN": secrets.pinggy_token}
    contract |= {name: str(value) for name, value in optional.items() if value is not None}
    return {**settings.env, **secrets.env, **launch.job_env, **contract}
