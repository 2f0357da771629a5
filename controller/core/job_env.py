"""The environment a job script receives (REFERENCE.md §7): our contract with sbatch scripts.

Pure: cell and cluster in, `EVAL_*` variables out. Secrets are added by the caller at act time and
never pass through here, so nothing this returns needs redacting.
"""

from __future__ import annotations

import json

from controller.core.types import Cell


def job_environment(
    cell: Cell,
    *,
    jobs_dir: str,
    username: str,
    gpu_memory_util: float,
    infra_error_threshold: int,
) -> dict[str, str]:
    env = {
        "EVAL_N_CONCURRENT": str(cell.n_concurrent),
        "EVAL_N_ATTEMPTS": str(cell.n_attempts),
        "EVAL_GPU_MEMORY_UTIL": f"{gpu_memory_util:g}",
        "EVAL_DAYTONA_THRESHOLD": str(infra_error_threshold),
        "EVAL_AGENT_NAME": cell.agent,
        "EVAL_AGENT_KWARGS": json.dumps(list(cell.agent_kwargs)),
        "EVAL_JOBS_DIR": jobs_dir,
        "EVAL_TIMEOUT_MULTIPLIER": f"{cell.timeout_multiplier:g}",
        "EVAL_HARBOR_CONFIG": cell.harbor_config,
        "EVAL_UPLOAD_USERNAME": username,
    }
    optional = {
        "EVAL_MAX_OUTPUT_TOKENS": cell.max_output_tokens,
        "EVAL_VLLM_TENSOR_PARALLEL_SIZE": cell.tensor_parallel_size,
        "EVAL_VLLM_DATA_PARALLEL_SIZE": cell.data_parallel_size,
        "EVAL_VLLM_MAX_MODEL_LEN": cell.max_model_len,
        "EVAL_CONDA_ENV": cell.conda_env,
    }
    env.update({name: str(value) for name, value in optional.items() if value is not None})
    return env
