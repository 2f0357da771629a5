"""Serving recipes keyed by harness (issue 20, item 4): one registry entry, no flip-restore.

The real job script (eval/slurm/eval_harbor.sbatch) runs under the local scheduler with a stand-in Harbor that prints
the serving variables it was given; the script prints the vLLM command it built from them. A terminus-2 EvalRun and
an openhands EvalRun on Qwen/Qwen3-32B (whose shipped entry gives `hermes` to the tool_calls pattern) must get no
parser and `hermes`, and a registry that forces a parser onto terminus-2 must fail `validate` at its line.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from controller.core.observed import JobState
from tests.e2e.conftest import REPO, Cluster
from tests.fixtures.evalctl import run_evalctl, wait_until

MODEL = "Qwen/Qwen3-32B"
DATASET = str(REPO / "eval" / "harbor" / "tiny-dataset")
SBATCH = REPO / "eval" / "slurm" / "eval_harbor.sbatch"
STUB_HARBOR = """#!/usr/bin/env bash
env | grep -E '^EVAL_(VLLM_|CONFIG_YAML)' | sort | sed 's/^/harbor-stub env: /'
echo "harbor-stub argv: $*"
"""
OPENHANDS = """  agent: openhands
  pinggy:
    pairs:
      - {name: pair-1, url: "https://pair-1.a.pinggy.link", secretRef: {name: pinggy-1, key: token}}"""


def fake_eval_env(root: Path) -> Path:
    """An eval env whose `harbor` only reports what the job script handed it."""
    harbor = root / "fake-env" / "bin" / "harbor"
    harbor.parent.mkdir(parents=True)
    harbor.write_text(STUB_HARBOR)
    harbor.chmod(0o755)
    return harbor.parents[1]


def job_output(cluster: Cluster, extra_run: str = "") -> str:
    """One acting pass over one cell; the output of the job it submitted, once the job has ended."""
    configs = cluster.root / "configs"  # the scaffold configs a site keeps next to its job script
    configs.mkdir()
    (configs / "dcagent_eval_config_openhands.yaml").write_text("n_concurrent_trials: 2\n")
    cluster.write(models=[MODEL], datasets=[DATASET], script=SBATCH, extra_run=extra_run,
                  env={"EVAL_ENV": str(fake_eval_env(cluster.root)), "EVAL_CONFIG_YAML_DIR": str(configs)})
    cluster.evalctl("reconcile", "--once")
    [job] = wait_until(lambda: [j for j in cluster.scheduler.observe() if not j.state.active], "the job to end")
    [output] = [p.read_text() for p in (cluster.root / "logs").glob("*.out")]
    assert job.state == JobState.COMPLETED and "harbor-stub argv:" in output, output
    return output


def vllm_line(output: str) -> str:
    [line] = [line for line in output.splitlines() if line.startswith("eval_harbor: vllm: ")]
    return line


def test_terminus2_runs_without_the_parser_the_entry_gives_openhands(cluster: Cluster) -> None:
    output = job_output(cluster)
    assert "EVAL_VLLM_TOOL_CALL_PARSER" not in output and "EVAL_VLLM_REASONING_PARSER" not in output, output
    assert "harbor-stub env: EVAL_VLLM_SWAP_SPACE=32" in output, "the entry's settings for every pattern still apply"
    assert vllm_line(output) == ("eval_harbor: vllm: vllm serve Qwen/Qwen3-32B --tensor-parallel-size 2 "
                                 "--max-model-len 32768 --gpu-memory-utilization 0.85 --swap-space 32 "
                                 "--trust-remote-code --enable-prefix-caching")


def test_openhands_on_the_same_entry_gets_hermes(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALCTL_SECRET_PINGGY_1_TOKEN", "tok-pair-1")
    output = job_output(cluster, extra_run=OPENHANDS)
    assert "harbor-stub env: EVAL_VLLM_TOOL_CALL_PARSER=hermes" in output, output
    assert "harbor-stub env: EVAL_VLLM_REASONING_PARSER=qwen3" in output
    assert "harbor-stub env: EVAL_CONFIG_YAML=dcagent_eval_config_openhands.yaml" in output
    assert f"-c {cluster.root / 'configs' / 'dcagent_eval_config_openhands.yaml'}" in output, "layered as a 2nd -c"
    assert "--enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3" in vllm_line(output)


REGISTRY_FORCING_A_PARSER = """models:
  Qwen/Qwen3-32B:
    tensor_parallel_size: 2
    serving:
      swap_space: 32
      tool_call_parser: hermes
"""
REGISTRY_PARSER_UNDER_TEXT = """models:
  Qwen/Qwen3-32B:
    serving:
      patterns:
        tool_calls: {tool_call_parser: hermes}
        text:
          reasoning_parser: qwen3
          tool_call_parser: qwen3_coder
"""


@pytest.mark.parametrize(("registry", "line", "col", "parser"), [
    (REGISTRY_FORCING_A_PARSER, 6, 25, "hermes"),   # for every pattern, terminus-2's included
    (REGISTRY_PARSER_UNDER_TEXT, 8, 29, "qwen3_coder"),   # under terminus-2's own pattern
])
def test_a_registry_that_forces_a_parser_onto_terminus2_fails_validate_at_its_line(
        cluster: Cluster, tmp_path: Path, registry: str, line: int, col: int, parser: str) -> None:
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "model_registry.yaml").write_text(registry)
    cluster.write(models=[MODEL], datasets=[DATASET], script=SBATCH)
    env = {**os.environ, "EVALCTL_CATALOG_DIR": str(catalog)}
    result = run_evalctl(("validate", "-f", str(cluster.spec)), spec=cluster.spec, store=cluster.store, env=env,
                         check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"{catalog / 'model_registry.yaml'}:{line}:{col}: EvalRun e2e: agent terminus-2 "), first
    assert f"tool_call_parser {parser}" in first and "every trial scores 0" in first

    cluster.write(models=[MODEL], datasets=[DATASET], script=SBATCH, extra_run="  agent: swe-agent")
    result = run_evalctl(("validate", "-f", str(cluster.spec)), spec=cluster.spec, store=cluster.store, env=env,
                         check=False)
    assert result.returncode == 0, "a harness that wants the parser may have it: " + result.stderr


FAKE_VLLM = """#!/usr/bin/env python3
import http.server, sys
print("fake-vllm argv:", sys.argv[1:], flush=True)
port = int(sys.argv[sys.argv.index("--port") + 1])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_the_job_script_serves_the_recipe_and_points_the_agent_at_it(tmp_path: Path) -> None:
    """EVAL_VLLM_SERVE=1: vLLM gets one flag per non-empty variable (extra args split with their quotes kept), the
    agent its api_base, and vLLM is stopped when Harbor ends."""
    vllm = tmp_path / "vllm"
    vllm.write_text(FAKE_VLLM)
    vllm.chmod(0o755)
    with socket.socket() as probe:  # a free port for the stand-in
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "EVAL_JOBS_DIR": str(tmp_path / "jobs"), "EVAL_ENV": str(fake_eval_env(tmp_path)),
           "EVAL_VLLM_SERVE": "1", "EVAL_VLLM_BIN": str(vllm), "EVAL_VLLM_PORT": str(port),
           "EVAL_VLLM_RETRY_SECONDS": "0.1", "EVAL_VLLM_MAX_RETRIES": "100", "EVAL_VLLM_TOOL_CALL_PARSER": "hermes",
           "EVAL_VLLM_REASONING_PARSER": "", "EVAL_VLLM_EXTRA_ARGS": "--override-generation-config "
                                                                   "'{\"temperature\":0.6}' --seed 42"}
    result = subprocess.run(["bash", str(SBATCH), MODEL, DATASET, "b1", "tag1"], env=env, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    [served] = [line for line in result.stdout.splitlines() if line.startswith("fake-vllm argv:")]
    assert served == ("fake-vllm argv: ['serve', 'Qwen/Qwen3-32B', '--enable-auto-tool-choice', '--tool-call-parser', "
                      "'hermes', '--override-generation-config', '{\"temperature\":0.6}', '--seed', '42', '--host', "
                      f"'127.0.0.1', '--port', '{port}']"), "an empty variable adds no flag"
    assert f"-m hosted_vllm/{MODEL} -e host_env:HostEnvironment --ak api_base=http://127.0.0.1:{port}/v1" in \
        result.stdout
    with socket.socket() as again:
        assert again.connect_ex(("127.0.0.1", port)) != 0, "vLLM was stopped with the job"
