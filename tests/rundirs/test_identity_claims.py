"""What a run dir's files each say ran (RULES §14 identity): config.json, meta.env and every trial result are read on
their own, and the gate holds the dir when any of them is not the cell — naming each file and what it says — while
a real run of the cell, spelled as Harbor and the job script spell it, is admitted.

Real files in Harbor 0.26's layout, read by the local reader (and by the run-dir probe, which parses trials on the
login node), judged by the gate.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from controller.adapters.rundirs import memo
from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.adapters.rundirs.remote import RunDirProbe
from controller.adapters.scheduler.commands import LocalCommands
from controller.adapters.secrets import SecretMask
from controller.core.admission import Admission, Admitted, Refusal, Refused, admit
from controller.core.observed import JobState, Recorded, RunDirFacts
from controller.core.planner import plan_cell
from controller.core.types import Cell
from controller.core.vocabulary import Rule
from tests.core.builders import NOW, POLICY, ago, cell, job, obs, row, sub
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS, write_config, write_job_result, write_meta_env, write_trial

MODEL = "laion/Qwen3-8B"
DATASET = "DCAgent2/terminal_bench_2"
RESOLVED = f"/lustre/evals/{DATASET}"  # where the job script's `realpath` finds it: what config.json records
CELL = cell(model=MODEL, benchmark=DATASET, n_attempts=2)
Edit = Callable[[dict[str, Any]], None]


@pytest.fixture(autouse=True)
def fresh_memos(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memo, "_MEMOS", {})
    monkeypatch.setenv("EVALCTL_CACHE_DIR", "")


def as_harbor_026_writes_it(model: str = f"hosted_vllm/{MODEL}", served: str = MODEL, dataset: str = RESOLVED) -> Edit:
    """A trial result's own record of what it ran, as Harbor 0.26 writes it (eval/harbor/README.md)."""
    def edit(doc: dict[str, Any]) -> None:
        doc["config"]["agent"]["model_name"] = model
        doc["agent_info"]["model_info"] = {"name": served, "provider": "hosted_vllm"}
        doc["source"] = dataset.rsplit("/", 1)[-1]
        doc["task_id"] = {"path": f"{dataset}/{doc['task_name']}"}
    return edit


def run_dir(jobs: Path, *, edit: Edit | None = None, config_model: str = MODEL, meta: dict[str, object] | None = None,
            config_attempts: int | None = 2) -> Path:
    """10 tasks × 2 attempts, half solved, with the job files the job script and Harbor write for CELL."""
    run = jobs / CELL.run_tag(1)
    for i in range(10):
        for attempt in range(2):
            trial = write_trial(run, f"t{i:03d}__{attempt:07d}", reward=float(i < 5), output_tokens=300)
            if edit is not None:
                doc = json.loads((trial / "result.json").read_text())
                edit(doc)
                (trial / "result.json").write_text(json.dumps(doc))
    write_config(run, model=f"hosted_vllm/{config_model}", dataset=RESOLVED, n_attempts=config_attempts or 1)
    if config_attempts is None:  # Harbor 0.25's sparse config leaves the default out
        config = json.loads((run / "config.json").read_text())
        del config["n_attempts"]
        (run / "config.json").write_text(json.dumps(config))
    write_meta_env(run, **{"MODEL": MODEL, "REPO_ID": DATASET, "BENCHMARK_NAME": "terminal_bench_2",
                           "AGENT_NAME": "terminus-2", "TIMEOUT_MULTIPLIER": 2.0, "N_ATTEMPTS": 2, "RESUME_COUNT": 0,
                           **(meta or {})})
    write_job_result(run, 20)
    return run


def observed(jobs: Path) -> RunDirFacts:
    [facts] = HarborRunDirs(str(jobs), REFERENCE_ERRORS).observe()
    return facts


def judged(facts: RunDirFacts, c: Cell = CELL, *, model_names: tuple[str, ...] = (),
           benchmark_names: tuple[str, ...] = ()) -> Admission:
    """The gate's verdict, the DB naming the cell's model and benchmark also by `model_names`/`benchmark_names`."""
    return admit(c, facts, POLICY.admission, requests=1, model_names=model_names, benchmark_names=benchmark_names)


def refused(facts: RunDirFacts, c: Cell = CELL, **names: tuple[str, ...]) -> Refused:
    verdict = judged(facts, c, **names)
    assert isinstance(verdict, Refused) and verdict.refusal == Refusal.IDENTITY, verdict.summary()
    assert verdict.remedy == "hold"
    return verdict


def test_a_real_run_of_the_cell_is_its_run_however_the_files_spell_it(tmp_path: Path) -> None:
    """`hosted_vllm/` on the model, the dataset's resolved path in config.json and the trials, its bare name as the
    trials' source: all the cell's."""
    run_dir(tmp_path, edit=as_harbor_026_writes_it())
    facts = observed(tmp_path)
    assert {(r.what, r.value) for r in facts.recorded if r.source == "trials"} == {
        ("model", MODEL), ("dataset", RESOLVED), ("dataset", "terminal_bench_2")}
    verdict = judged(facts)
    assert isinstance(verdict, Admitted) and verdict.evidence.identity == "ok", verdict.summary()


def test_a_served_id_names_no_model(tmp_path: Path) -> None:
    """vLLM's numeric served name (what the fixture's trials report) says nothing about the weights: not a claim."""
    run_dir(tmp_path, edit=as_harbor_026_writes_it(model="hosted_vllm/48213", served="48213"))
    facts = observed(tmp_path)
    assert not [r for r in facts.recorded if r.source == "trials" and r.what == "model"]
    assert isinstance(judged(facts), Admitted)


def test_job_files_that_disagree_are_both_named(tmp_path: Path) -> None:
    run_dir(tmp_path, config_model="org/Other-70B")
    verdict = refused(observed(tmp_path))
    assert "model 'org/Other-70B', not 'laion/Qwen3-8B'" in verdict.reason
    assert "meta.env: 'laion/Qwen3-8B'" in verdict.reason and "config.json: 'org/Other-70B'" in verdict.reason


def test_the_trials_model_is_checked_by_the_dbs_family_names(tmp_path: Path) -> None:
    """A trial naming the model by another name of its family is the cell's; one naming another model is not."""
    run_dir(tmp_path, edit=as_harbor_026_writes_it(model="hosted_vllm/laion/qwen3-8b-sft-final"))
    facts = observed(tmp_path)
    assert isinstance(judged(facts, model_names=("laion/Qwen3-8B-SFT-final",)), Admitted)
    assert "trials: 'laion/qwen3-8b-sft-final'" in refused(facts).reason


@pytest.mark.parametrize("dataset", ["/lustre/evals/DCAgent2/tb2", "/lustre/evals/OtherOrg/tb2"])
def test_a_dataset_is_the_cells_by_its_familys_name_and_its_org(tmp_path: Path, dataset: str) -> None:
    """`tb2` is a name of the cell's benchmark in the DB; under the cell's org it is the cell's, under another not."""
    run_dir(tmp_path, edit=as_harbor_026_writes_it(dataset=dataset))
    facts = observed(tmp_path)
    if "OtherOrg" in dataset:
        verdict = refused(facts, benchmark_names=("tb2",))
        assert f"dataset {dataset!r}, not 'DCAgent2/terminal_bench_2' (" in verdict.reason
    else:
        assert isinstance(judged(facts, benchmark_names=("tb2",)), Admitted)
    assert not isinstance(judged(facts), Admitted), "tb2 is no name of the cell's benchmark without the family"


def test_recorded_attempts_are_the_cells_or_the_dir_is_held(tmp_path: Path) -> None:
    run_dir(tmp_path, meta={"N_ATTEMPTS": 3})
    verdict = refused(observed(tmp_path))
    assert "attempts 3, not 2 (config.json: 2; meta.env: 3)" in verdict.reason


def test_a_run_that_does_not_record_its_attempts_is_short_of_the_cells(tmp_path: Path) -> None:
    """Harbor 0.25's sparse config and an old meta.env say nothing of attempts; the cell wants 3 of each of the 10
    tasks the run shows, so Harbor's total of 20 is not the whole run."""
    run_dir(tmp_path, config_attempts=None, meta={"N_ATTEMPTS": ""})
    verdict = judged(observed(tmp_path), CELL.model_copy(update={"n_attempts": 3}))
    assert isinstance(verdict, Refused) and verdict.refusal == Refusal.INCOMPLETE, verdict.summary()
    assert "20 of 30 expected trials (harbor)" in verdict.reason


def test_the_probe_reads_what_the_trials_say_as_a_local_pass_does(tmp_path: Path) -> None:
    """The login node parses the trial results: what they name must reach the gate as from a local read."""
    run_dir(tmp_path, edit=as_harbor_026_writes_it(model="hosted_vllm/org/Other-70B"))
    probed = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS, probe=RunDirProbe(LocalCommands(), "login")).observe()
    memo._MEMOS.clear()
    assert probed == (observed(tmp_path),)
    assert Recorded(what="model", value="org/Other-70B", source="trials") in probed[0].recorded


def test_what_the_files_say_is_masked(tmp_path: Path) -> None:
    secret = "dtn-9f8e7d6c5b4a-live"
    run_dir(tmp_path, edit=as_harbor_026_writes_it(dataset=f"/lustre/{secret}/{DATASET}"))
    [facts] = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS, mask=SecretMask([secret])).observe()
    assert secret not in facts.model_dump_json()
    assert Recorded(what="dataset", value=f"/lustre/***/{DATASET}", source="trials") in facts.recorded


def test_no_flag_releases_an_identity_hold(tmp_path: Path) -> None:
    """upload.forceUpload and upload.partial: upload publish what is short; a run that is not the cell's, never."""
    run = run_dir(tmp_path, meta={"TIMEOUT_MULTIPLIER": 16})
    written = ago(hours=3).timestamp()  # before the job ended: settled
    for path in run.rglob("*"):
        os.utime(path, (written, written))
    tag = CELL.run_tag(1)
    ended = job(tag, JobState.COMPLETED, started=ago(hours=4), ended=ago(hours=2))
    released = POLICY.model_copy(update={"force_upload": True, "max_total_fires": 1, "admission": POLICY.admission
                                         .model_copy(update={"partial_upload": True, "min_completed_fraction": 0.0})})
    plan = plan_cell(CELL, obs(rows=(row("Started", job_name=tag),), subs=(sub(CELL),), jobs=(ended,),
                               dirs=(observed(tmp_path),)), released, NOW)
    assert [a.kind.value for a in plan.actions] == ["hold"] and plan.rule == Rule.ADMISSION_IDENTITY, plan.reason
    assert "timeout multiplier 16, not 2 (config.json: 2; meta.env: 16)" in plan.reason


def restricted(run: Path, **dataset: object) -> None:
    config = json.loads((run / "config.json").read_text())
    config["datasets"][0].update(dataset)
    (run / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(("restrict", "said"), [
    ({"task_names": ["t000", "t001"]}, "tasks task_names (2), not the whole dataset (config.json)"),
    ({"exclude_task_names": ["t009"]}, "tasks exclude_task_names (1), not the whole dataset (config.json)"),
    ({"n_tasks": 10}, "tasks n_tasks 10, not the whole dataset (config.json)"),
    ({"task_names": None, "exclude_task_names": [], "n_tasks": None}, None),  # Harbor's defaults: no filter
])
def test_a_run_harbor_filtered_to_part_of_the_dataset_is_no_run_of_the_cell(
        tmp_path: Path, restrict: dict[str, object], said: str | None) -> None:
    """Complete by Harbor's total of a filtered run is complete for that subset only (even `n_tasks` equal to the
    dataset's size says the run may hold fewer tasks than it has)."""
    restricted(run_dir(tmp_path), **restrict)
    facts = observed(tmp_path)
    if said is None:
        assert isinstance(judged(facts), Admitted)
    else:
        assert said in refused(facts).reason


def test_a_shard_recorded_by_the_job_script_is_no_run_of_the_cell(tmp_path: Path) -> None:
    run_dir(tmp_path, meta={"SHARD": "1/4"})
    assert "tasks shard 1/4, not the whole dataset (meta.env)" in refused(observed(tmp_path)).reason
