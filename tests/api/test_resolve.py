"""Spec → cells: presets, size rule, precedence, hardware variants, pinggy need, concurrency, fingerprint."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from controller.api.catalog import Catalog, ModelEntry, ModelRegistry, load_catalog
from controller.api.evalcluster import EvalCluster
from controller.api.evalrun import EvalRun
from controller.api.resolve import benchmark_name, fingerprint, resolution_notes, resolve, walltime_warnings
from controller.core.types import EnvironmentOverrides

CATALOG = load_catalog()
SMALL = "laion/Qwen3-8B-sft-v3"  # not in the registry: the size rule decides


def cluster(**spec: Any) -> EvalCluster:
    base = {"scheduler": {"type": "slurm"}, "jobsDir": "/j", "logsDir": "/l", "jobScript": "s.sbatch"}
    return EvalCluster.model_validate(
        {"apiVersion": "evalrun.io/v1alpha1", "kind": "EvalCluster", "metadata": {"name": "hpc"}, "spec": base | spec}
    )


def run(**spec: Any) -> EvalRun:
    base = {"cluster": "hpc", "models": [SMALL], "presets": ["tb2"]}
    return EvalRun.model_validate(
        {"apiVersion": "evalrun.io/v1alpha1", "kind": "EvalRun", "metadata": {"name": "r"}, "spec": base | spec}
    )


def one(evalrun: EvalRun, on: EvalCluster | None = None, catalog: Catalog = CATALOG):
    [cell] = resolve(evalrun, on or cluster(), catalog)
    return cell


# --------------------------------------------------------------------------- presets (RULES §6)

PRESET_TABLE = [
    ("tb2", "DCAgent2/terminal_bench_2", 64, 267),
    ("v2", "DCAgent/dev_set_v2", 128, 300),
    ("swebench", "DCAgent2/swebench-verified-random-100-folders", 32, 300),
    ("dev", "DCAgent/dev_set_71_tasks", 32, 213),
    ("bfcl", "DCAgent2/bfcl-parity", 32, None),
    ("aider", "DCAgent2/aider_polyglot", 32, None),
    ("medagentbench", "DCAgent2/medagentbench", 32, None),
    ("swebench_full", "DCAgent/swebench-verified", 32, 1500),
    ("gaia", "DCAgent/gaia_127", 32, 381),
    ("financeagent", "DCAgent2/financeagent", 16, None),
]


@pytest.mark.parametrize(("preset", "dataset", "n_concurrent", "expected_trials"), PRESET_TABLE)
def test_every_preset_row(preset: str, dataset: str, n_concurrent: int, expected_trials: int | None) -> None:
    cell = one(run(presets=[preset]), cluster(maxConcurrentTrials=1000))
    assert (cell.benchmark, cell.dataset, cell.n_concurrent) == (preset, dataset, n_concurrent)
    assert cell.benchmark_name == dataset.rsplit("/", 1)[-1]
    tasks = CATALOG.presets.presets[preset].tasks
    assert (tasks * cell.n_attempts if tasks else None) == expected_trials


def test_table_covers_the_catalog() -> None:
    assert {row[0] for row in PRESET_TABLE} == set(CATALOG.presets.presets)


def test_id_expands_to_the_three_id_evals_models_outer() -> None:
    cells = resolve(run(models=["a/m-8B", "b/m-32B"], presets=["id", "gaia"]), cluster(), CATALOG)
    assert [(c.model, c.benchmark) for c in cells] == [
        (m, b) for m in ("a/m-8B", "b/m-32B") for b in ("tb2", "v2", "swebench", "gaia")
    ]
    assert {str(c.evalrun) for c in cells} == {"r"} and {c.cluster for c in cells} == {"hpc"}


# --------------------------------------------------------------------------- concurrency


def test_n_concurrent_is_capped_by_the_cluster() -> None:
    cells = resolve(run(presets=["v2", "swebench"]), cluster(maxConcurrentTrials=48), CATALOG)
    assert [c.n_concurrent for c in cells] == [48, 32]


def test_financeagent_never_above_16() -> None:
    assert one(run(presets=["financeagent"]), cluster(maxConcurrentTrials=4096)).n_concurrent == 16
    assert one(run(presets=["financeagent"]), cluster(maxConcurrentTrials=8)).n_concurrent == 8


def test_explicit_datasets_use_the_cluster_ceiling_and_keep_their_spelling() -> None:
    cells = resolve(
        run(presets=None, datasets=["DCAgent2/terminal_bench_2/", "/data/local_set"]),
        cluster(maxConcurrentTrials=40),
        CATALOG,
    )
    assert [(c.benchmark, c.dataset, c.benchmark_name, c.n_concurrent) for c in cells] == [
        ("DCAgent2/terminal_bench_2/", "DCAgent2/terminal_bench_2/", "terminal_bench_2", 40),
        ("/data/local_set", "/data/local_set", "local_set", 40),
    ]


def test_benchmark_name() -> None:
    assert benchmark_name("DCAgent/dev_set_v2") == "dev_set_v2"
    assert benchmark_name("dev_set_v2/") == "dev_set_v2"


# --------------------------------------------------------------------------- size rule


@pytest.mark.parametrize(
    ("model", "config", "multiplier", "note"),
    [
        ("laion/Qwen3-8B-sft-v3", "dcagent_eval_defaults.yaml", 2.0, None),
        ("org/Qwen2.5-1.5B-Instruct", "dcagent_eval_defaults.yaml", 2.0, None),
        ("org/model-14b", "dcagent_eval_defaults.yaml", 2.0, None),
        ("org/Qwen3-30b-a3b-sft", "dcagent_eval_defaults_32b.yaml", 16.0, None),
        ("org/Qwen3-30B-A3B", "dcagent_eval_defaults_32b.yaml", 16.0, None),
        ("org/Model-32B-v2", "dcagent_eval_defaults_32b.yaml", 16.0, None),
        ("org/model-42B", "dcagent_eval_defaults_32b.yaml", 16.0, None),
        ("org/Llama-3.1-70B-Instruct", "dcagent_eval_defaults.yaml", 2.0, "size 70B is outside the size bands"),
        ("org/model-20B", "dcagent_eval_defaults.yaml", 2.0, "size 20B is outside the size bands"),
        ("laion/GLM-4_7-swesmith", "dcagent_eval_defaults.yaml", 2.0, "no size token in model name"),
    ],
)
def test_size_rule(model: str, config: str, multiplier: float, note: str | None) -> None:
    evalrun = run(models=[model])
    cell = one(evalrun)
    assert (cell.harbor_config, cell.timeout_multiplier) == (config, multiplier)
    expected = () if note is None else (f"{model}: {note}: using base default dcagent_eval_defaults.yaml ×2",)
    assert resolution_notes(evalrun, cluster(), CATALOG) == expected


# --------------------------------------------------------------------------- precedence and registry


def with_registry(**models: dict[str, Any]) -> Catalog:
    registry = ModelRegistry(models={name: ModelEntry.model_validate(entry) for name, entry in models.items()})
    return CATALOG.model_copy(update={"models": registry})


def test_explicit_beats_registry_beats_size_rule() -> None:
    catalog = with_registry(
        **{SMALL: {"harbor_config": "registry.yaml", "timeout_multiplier": 4.0, "agent_kwargs": ["reg=1"]}}
    )
    size = one(run())
    registry = one(run(), catalog=catalog)
    explicit = one(run(harborConfig="explicit.yaml", timeoutMultiplier=8.0, agentKwargs=["cli=1"]), catalog=catalog)
    assert (size.harbor_config, size.timeout_multiplier, size.agent_kwargs) == ("dcagent_eval_defaults.yaml", 2.0, ())
    assert (registry.harbor_config, registry.timeout_multiplier, registry.agent_kwargs) == (
        "registry.yaml",
        4.0,
        ("reg=1",),
    )
    assert (explicit.harbor_config, explicit.timeout_multiplier, explicit.agent_kwargs) == (
        "explicit.yaml",
        8.0,
        ("cli=1",),
    )


def test_layers_apply_per_parameter() -> None:
    catalog = with_registry(**{"org/mystery": {"timeout_multiplier": 3.0}})
    evalrun = run(models=["org/mystery"], harborConfig="openhands_x.yaml")
    cell = one(evalrun, catalog=catalog)
    assert (cell.harbor_config, cell.timeout_multiplier) == ("openhands_x.yaml", 3.0)
    assert resolution_notes(evalrun, cluster(), catalog) == ()


def test_registry_serve_settings_and_hardware_variant() -> None:
    evalrun = run(models=["Qwen/Qwen3-32B"])
    base = one(evalrun)
    assert (base.conda_env, base.tensor_parallel_size, base.max_model_len) == ("otagent-fix", 2, 32768)
    assert one(evalrun, cluster(hardwareProfile="gh200")).tensor_parallel_size == 1
    assert one(evalrun, cluster(hardwareProfile="a100-64")).tensor_parallel_size == 4
    assert one(evalrun, cluster(hardwareProfile="unknown-gpu")).tensor_parallel_size == 2
    assert base.timeout_multiplier == 16.0  # the registry does not set it: size rule


def test_thinking_comes_from_the_registry_never_from_a_preset() -> None:
    thinking_on = ('extra_body={"chat_template_kwargs":{"enable_thinking":true}}',)
    cells = resolve(run(models=["Qwen/Qwen3.5-35B-A3B", SMALL], presets=["id"]), cluster(), CATALOG)
    assert [c.agent_kwargs for c in cells] == [thinking_on] * 3 + [()] * 3
    assert cells[0].conda_env == "eval-qwen35"
    assert one(run(models=["Qwen/Qwen3.5-35B-A3B"]), cluster(hardwareProfile="gh200")).data_parallel_size == 2


# --------------------------------------------------------------------------- pinggy


@pytest.mark.parametrize(
    ("agent", "harbor_config", "needs"),
    [
        ("terminus-2", None, False),
        ("terminus-2", "hpc/harbor_yaml/eval/dcagent_eval_config_openhands.yaml", True),
        ("terminus-2", "dcagent_eval_config_openhands_qwen3_coder.yaml", True),
        ("terminus-2", "dcagent_eval_config_swe_agent.yaml", True),
        ("terminus-2", "dcagent_eval_config_mini_swe_agent.yaml", True),
        ("terminus-2", "dcagent_eval_config_aider_agent_nothink.yaml", True),
        ("openhands", None, True),
        ("swe-agent", None, True),
        ("mini-swe-agent", None, True),
        ("aider", None, True),
        ("terminus-2", "ctx131k_eval.yaml", False),
    ],
)
def test_pinggy_need_by_harness(agent: str, harbor_config: str | None, needs: bool) -> None:
    assert one(run(agent=agent, harborConfig=harbor_config)).needs_pinggy is needs


def test_aider_benchmark_with_terminus_needs_no_pinggy() -> None:
    assert not one(run(presets=["aider"])).needs_pinggy


# --------------------------------------------------------------------------- fingerprint


def test_fingerprint_is_sha256_of_canonical_json() -> None:
    cell = one(run())
    payload = {
        "agent": "terminus-2",
        "agent_kwargs": [],
        "harbor_config": "dcagent_eval_defaults.yaml",
        "n_attempts": 3,
        "overrides": {"override_cpus": None, "override_memory_mb": None, "override_storage_mb": None},
        "timeout_multiplier": 2.0,
    }
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    assert cell.fingerprint == hashlib.sha256(canonical.encode()).hexdigest()


def test_fingerprint_ignores_transport() -> None:
    reference = one(run(harborConfig="dcagent_eval_defaults.yaml")).fingerprint
    moved = one(
        run(
            harborConfig="/other/site/hpc/harbor_yaml/eval/dcagent_eval_defaults.yaml",
            pinggy={"pairs": [{"name": "p8", "url": "https://x.a.pinggy.link", "secretRef": {"name": "pinggy-8"}}]},
        ),
        cluster(
            scheduler={"type": "slurm", "ssh": "login.other"},
            jobsDir="s3://bucket/jobs",
            logsDir="/elsewhere",
            jobScript="/site/eval.sbatch",
            maxConcurrentTrials=7,
            env={"VLLM_PORT": "8123"},
        ),
    ).fingerprint
    assert moved == reference


@pytest.mark.parametrize(
    "change",
    [
        {"agent": "openhands"},
        {"timeoutMultiplier": 3.0},
        {"overrides": {"cpus": 4}},
        {"agentKwargs": ["temperature=0.6"]},
        {"nAttempts": 1},
        {"harborConfig": "dcagent_eval_defaults_32b.yaml"},
    ],
)
def test_fingerprint_changes_with_what_changes_results(change: dict[str, Any]) -> None:
    assert one(run(**change)).fingerprint != one(run()).fingerprint


def test_overrides_reach_the_cell() -> None:
    cell = one(run(overrides={"cpus": 4, "memoryMb": 8192}))
    assert cell.overrides == EnvironmentOverrides(override_cpus=4, override_memory_mb=8192)


def test_fingerprint_function_is_the_cells() -> None:
    cell = one(run(agentKwargs=["a=1"]))
    assert cell.fingerprint == fingerprint(
        cell.agent, cell.harbor_config, cell.timeout_multiplier, cell.overrides, cell.agent_kwargs, cell.n_attempts
    )


# --------------------------------------------------------------------------- serving recipes, per-preset config


def test_one_entry_serves_each_harness_its_own_way() -> None:
    terminus = one(run(models=["Qwen/Qwen3-32B"]))
    openhands = one(run(models=["Qwen/Qwen3-32B"], agent="openhands"))
    assert (terminus.serving.pattern, terminus.serving.tool_call_parser, terminus.serving.reasoning_parser) == (
        "text", None, None)
    assert (openhands.serving.pattern, openhands.serving.tool_call_parser, openhands.serving.reasoning_parser) == (
        "tool_calls", "hermes", "qwen3")
    for cell in (terminus, openhands):  # what the entry sets for every pattern
        assert (cell.serving.swap_space, cell.serving.trust_remote_code, cell.serving.extra_args) == (
            32, True, "--enable-prefix-caching")


def test_a_harness_runs_its_harbor_agent_with_its_scaffold_config() -> None:
    cell = one(run(agent="openhands-qwen3-coder", presets=["bfcl"]))
    assert (cell.agent, cell.serving.pattern) == ("openhands", "native_coder")
    assert cell.config_yaml == "dcagent_eval_config_openhands_qwen3_coder.yaml", "the scaffold's, not the preset's"
    assert cell.needs_pinggy
    notes = resolution_notes(run(agent="openhands-qwen3-coder", presets=["bfcl"]), cluster(), CATALOG)
    assert notes == ("bfcl: agent openhands-qwen3-coder runs with its scaffold config "
                     "dcagent_eval_config_openhands_qwen3_coder.yaml, not the preset's "
                     "dcagent_eval_config_no_override.yaml",)


def test_an_unlisted_agent_runs_as_itself_with_the_default_pattern() -> None:
    cell = one(run(models=["Qwen/Qwen3-32B"], agent="my-agent"))
    assert (cell.agent, cell.serving.pattern, cell.serving.tool_call_parser, cell.config_yaml) == (
        "my-agent", "text", None, None)


@pytest.mark.parametrize("preset", ["aider", "bfcl", "medagentbench", "gaia"])
def test_ood_presets_pin_the_no_override_config(preset: str) -> None:
    assert one(run(presets=[preset])).config_yaml == "dcagent_eval_config_no_override.yaml"


def test_id_presets_pin_no_config_yaml() -> None:
    assert {c.config_yaml for c in resolve(run(presets=["id"]), cluster(), CATALOG)} == {None}


def test_a_preset_walltime_within_the_cluster_maximum_is_the_cells() -> None:
    roomy = cluster(timeLimit="24:00:00", maxTimeLimit="72:00:00")
    cells = resolve(run(presets=["swebench_full", "tb2"]), roomy, CATALOG)
    assert [c.time_limit for c in cells] == ["48:00:00", "24:00:00"], "tb2 has the cluster's timeLimit, on the cell"
    assert walltime_warnings(run(presets=["swebench_full"]), roomy, CATALOG) == ()


def test_a_preset_walltime_over_the_cluster_maximum_is_clamped_with_a_warning() -> None:
    evalrun = run(presets=["swebench_full"])
    assert one(evalrun, cluster(timeLimit="24:00:00")).time_limit == "24:00:00"
    [warning] = walltime_warnings(evalrun, cluster(timeLimit="24:00:00"), CATALOG)
    assert warning.startswith("preset swebench_full asks for walltime 48:00:00, more than cluster hpc allows "
                              "(maxTimeLimit 24:00:00): its jobs get 24:00:00 and are resumed")


def test_a_preset_asking_for_walltime_auto_sizes_its_cells_from_the_clusters_time_limit() -> None:
    """A preset's `walltime: auto` is no time limit: its cells ask the cluster's timeLimit until there is evidence,
    and are sized (RULES §16); what they measure, so the fingerprint, is unchanged."""
    presets = CATALOG.presets.model_copy(update={"presets": {
        **CATALOG.presets.presets, "swebench_full": CATALOG.presets.presets["swebench_full"].model_copy(
            update={"walltime": "auto"})}})
    auto = CATALOG.model_copy(update={"presets": presets})
    evalrun, roomy = run(presets=["swebench_full"]), cluster(timeLimit="24:00:00", maxTimeLimit="72:00:00")

    sized, fixed = one(evalrun, roomy, auto), one(evalrun, roomy)

    assert (sized.walltime_auto, sized.time_limit) == (True, "24:00:00")
    assert (fixed.walltime_auto, fixed.time_limit) == (False, "48:00:00")
    assert sized.fingerprint == fixed.fingerprint and walltime_warnings(evalrun, roomy, auto) == ()


def test_the_parsers_are_part_of_the_fingerprint_and_the_config_yaml_is_not() -> None:
    terminus = one(run(models=["Qwen/Qwen3-32B"]))
    assert terminus.fingerprint == fingerprint(terminus.agent, terminus.harbor_config, terminus.timeout_multiplier,
                                               terminus.overrides, terminus.agent_kwargs, terminus.n_attempts), \
        "settings that do not reach the agent (swap space, prefix caching) leave the identity as it was"
    parsed = one(run(models=["Qwen/Qwen3-32B"], agent="openhands"))
    assert parsed.fingerprint == fingerprint("openhands", parsed.harbor_config, parsed.timeout_multiplier,
                                             parsed.overrides, parsed.agent_kwargs, parsed.n_attempts, parsed.serving)
    assert parsed.fingerprint != fingerprint("openhands", parsed.harbor_config, parsed.timeout_multiplier,
                                             parsed.overrides, parsed.agent_kwargs, parsed.n_attempts)
    bfcl = one(run(presets=["bfcl"]))
    assert bfcl.config_yaml and bfcl.fingerprint == one(run(presets=None, datasets=["DCAgent2/bfcl-parity"])).fingerprint, \
        "the preset (its dataset) chooses the config yaml: cells from before keep their identity"
