"""Loading and validating spec files: the example loads, every broken file reports one precise error."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from controller.api.evalrun import EvalRunSpec
from controller.api.loader import SpecError, SpecErrors, format_errors, load_specs, parse_resource
from controller.core.types import ClusterRef

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "specs" / "examples" / "leonardo.yaml"
BROKEN = sorted((Path(__file__).parent / "broken").glob("*.yaml"))
EXPECT = re.compile(r"# expect: (\d+):(\d+): (.+)")
TRACEBACK_ISH = ("Traceback", 'File "', "Error(", "pydantic", "errors.pydantic.dev", "input_value")


def errors_of(*paths: Path) -> list[SpecError]:
    with pytest.raises(SpecErrors) as caught:
        load_specs(list(paths), preflight=True)  # what `validate` refuses
    return caught.value.errors


def test_example_loads_cleanly() -> None:
    specs = load_specs([EXAMPLE])
    cluster = specs.clusters[ClusterRef(name="leonardo")]
    assert cluster.cluster.spec.scheduler.type == "slurm"
    assert cluster.job_script == "/leonardo_work/evals/eval/leonardo/eval_harbor.sbatch", "a login-node path, as is"
    [run] = specs.evalruns
    assert run.run.spec.models == ["laion/Qwen3-8B-sft-v3", "Qwen/Qwen3-32B"]
    assert run.run.spec.presets == ["id"]
    assert run.file == EXAMPLE and run.directory == EXAMPLE.parent
    assert specs.cluster_of(run) is cluster


def test_directory_walk_finds_yaml_and_yml_below_sorted(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    cluster_doc, run_doc = text.split("\n---\n")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "run.yml").write_text(run_doc)
    (tmp_path / "a.yaml").write_text(cluster_doc)
    (tmp_path / "notes.txt").write_text("not a spec")
    specs = load_specs([tmp_path])
    assert list(specs.clusters) == [ClusterRef(name="leonardo")]
    assert specs.evalruns[0].file == tmp_path / "b" / "run.yml"
    assert specs.evalruns[0].directory == tmp_path / "b"


def test_same_file_twice_is_read_once(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / "leonardo.yaml")
    specs = load_specs([tmp_path, tmp_path / "leonardo.yaml"])
    assert len(specs.evalruns) == 1


def test_corpus_is_big_enough() -> None:
    assert len(BROKEN) >= 24


@pytest.mark.parametrize("path", BROKEN, ids=[p.stem for p in BROKEN])
def test_broken_spec_reports_exactly_its_mistake(path: Path) -> None:
    expected = EXPECT.match(path.read_text().splitlines()[0])
    assert expected, f"{path.name} needs a first line '# expect: LINE:COL: text'"
    line, col, text = int(expected[1]), int(expected[2]), expected[3].strip()
    errors = errors_of(path)
    assert len(errors) == 1, format_errors(errors)
    [error] = errors
    assert (error.file, error.line, error.col) == (str(path), line, col), str(error)
    assert text in error.message, str(error)
    assert not any(marker in str(error) for marker in TRACEBACK_ISH), str(error)
    assert "s3cr3t" not in str(error), "a secret value leaked into the message"


def test_errors_from_all_files_are_collected_in_file_order() -> None:
    first, second = BROKEN[8], BROKEN[3]
    errors = errors_of(first, second)
    assert [e.file for e in errors] == [str(first), str(second)]


def test_whole_corpus_at_once_never_raises_anything_else() -> None:
    errors = errors_of(Path(__file__).parent / "broken")
    assert {e.file for e in errors} >= {str(p) for p in BROKEN}
    assert "s3cr3t" not in format_errors(errors)


def test_missing_path_and_empty_directory(tmp_path: Path) -> None:
    errors = errors_of(tmp_path / "nope.yaml", tmp_path)
    assert [str(e) for e in errors] == [
        f"{tmp_path / 'nope.yaml'}:1:1: no such file or directory; check the -f path",
        f"{tmp_path}:1:1: directory holds no *.yaml or *.yml files",
    ]


def test_several_errors_in_one_document_are_all_reported(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "apiVersion: evalrun.io/v1alpha1\nkind: EvalCluster\nmetadata: {name: x}\nspec:\n"
        "  scheduler: {type: slurm}\n  jobsDir: /j\n  logsDir: /l\n  jobScript: s\n"
        "  maxConcurrentTrials: 0\n  gpuMemoryUtil: 2\n  colour: blue\n"
    )
    assert [(e.line, e.col) for e in errors_of(path)] == [(9, 24), (10, 18), (11, 3)]


def test_spec_error_format() -> None:
    errors = [SpecError("a.yaml", 3, 5, "boom"), SpecError("b.yaml", 1, 1, "bang")]
    assert str(errors[0]) == "a.yaml:3:5: boom"
    assert format_errors(errors) == "a.yaml:3:5: boom\nb.yaml:1:1: bang"
    assert str(SpecErrors(errors)) == format_errors(errors)


def test_parse_resource_accepts_a_custom_resource_with_status() -> None:
    resource = {
        "apiVersion": "evalrun.io/v1alpha1",
        "kind": "EvalRun",
        "metadata": {"name": "r", "uid": "1234", "generation": 3},
        "spec": {"cluster": "c", "models": ["org/m"], "presets": ["tb2"]},
        "status": {"conditions": []},
    }
    run = parse_resource(resource)
    assert run.metadata.generation == 3


def test_parse_resource_reports_without_positions_when_there_are_none() -> None:
    with pytest.raises(SpecErrors) as caught:
        parse_resource({"apiVersion": "evalrun.io/v1alpha1", "kind": "EvalRun", "metadata": {"name": "r"}}, "cr/r")
    assert str(caught.value) == "cr/r:1:1: missing required field `spec` in the document; add `spec: …`"


def test_python_code_may_still_use_snake_case_names() -> None:
    spec = EvalRunSpec(cluster="c", models=["org/m"], presets=["tb2"], force_eval=True)
    assert spec.force_eval


def test_status_is_ignored_and_positions_survive(tmp_path: Path) -> None:
    path = tmp_path / "cr.yaml"
    text = EXAMPLE.read_text().replace("  maxConcurrentTrials: 48\n", "  maxConcurrentTrials: -3\n")
    path.write_text(text.replace("\n---\n", "\nstatus: {phase: x}\n---\n") + "status: {x: 1}\n")
    [error] = errors_of(path)
    assert (error.line, error.col, error.message.split(":")[0]) == (21, 24, "spec.maxConcurrentTrials")


def test_typo_next_to_a_secret_ref_is_not_called_a_secret(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    pair = "\n  pinggy: {pairs: [{name: p, urll: https://x, secretRef: {name: s}}]}\n"
    path.write_text(EXAMPLE.read_text().rstrip("\n") + pair)
    [error] = errors_of(path)
    assert error.message == "unknown field `urll` in spec.pinggy.pairs[0]; did you mean `url`?"


SECRET_PLACES = {"env", "secretEnv", "secretRef", "pinggy"}
ODD_VALUES = [None, [], {}, "x", 0, -1, 1.5, True, [{"a": 1}], "s3cr3t-value"]


def leaves(node: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(node, dict):
        return [path] + [p for k, v in node.items() for p in leaves(v, (*path, k))]
    if isinstance(node, list):
        return [path] + [p for i, v in enumerate(node) for p in leaves(v, (*path, i))]
    return [path]


def test_any_value_anywhere_gives_spec_errors_never_a_crash(tmp_path: Path) -> None:
    """Every field of the example replaced by every odd value: SpecErrors with sane positions, or a valid spec."""
    documents = list(YAML(typ="safe").load_all(EXAMPLE.read_text()))
    path = tmp_path / "mutant.yaml"
    for index, document in enumerate(documents):
        for where in leaves(document)[1:]:
            for value in ODD_VALUES:
                mutant = copy.deepcopy(documents)
                node = mutant[index]
                for part in where[:-1]:
                    node = node[part]
                node[where[-1]] = value
                with path.open("w") as out:
                    YAML(typ="safe").dump_all(mutant, out)
                try:
                    load_specs([path])
                except SpecErrors as exc:
                    assert all(e.file == str(path) and e.line >= 1 and e.col >= 1 for e in exc.errors)
                    if SECRET_PLACES & set(where):
                        assert "s3cr3t" not in str(exc)


@pytest.mark.parametrize("encode", [
    lambda text: text.replace("\n", "\r\n").encode(),
    lambda text: ("\ufeff" + text).encode(),
    lambda text: ("\ufeff" + text.replace("\n", "\r\n")).encode(),
], ids=["CRLF", "BOM", "BOM and CRLF"])
def test_crlf_and_a_byte_order_mark_keep_positions(tmp_path: Path, encode: Any) -> None:
    broken = Path(__file__).parent / "broken" / "35_duration_overflow.yaml"
    path = tmp_path / "spec.yaml"
    path.write_bytes(encode(broken.read_text()))
    shutil.copy(broken.parent / "eval.sbatch", tmp_path)
    [error] = errors_of(path)
    assert (error.line, error.col) == (18, 22), str(error)


MISSING_SCRIPT = """\
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: hpc}}
spec:
  scheduler: {scheduler}
  jobsDir: /work/jobs
  logsDir: /work/logs
  jobScript: {script}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: run}}
spec: {{cluster: hpc, models: [org/m], presets: [tb2]}}
"""


def test_a_missing_local_job_script_is_refused_only_where_a_job_would_be_submitted(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(MISSING_SCRIPT.format(scheduler="{type: slurm}", script="jobs/eval.sbatch"))
    assert load_specs([spec]).evalruns, "status, explain and report still read what ran"
    with pytest.raises(SpecErrors) as caught:
        load_specs([spec], preflight=True)
    assert str(caught.value) == (f"{spec}:8:14: spec.jobScript: {tmp_path}/jobs/eval.sbatch does not exist; fix the "
                                 "path (a relative one is read from this file's directory)")
    (tmp_path / "jobs").mkdir()
    with pytest.raises(SpecErrors, match=r"eval\.sbatch does not exist"):
        load_specs([spec], preflight=True)
    (tmp_path / "jobs" / "eval.sbatch").mkdir()
    with pytest.raises(SpecErrors, match=r"eval\.sbatch is not a file"):
        load_specs([spec], preflight=True)
    (tmp_path / "jobs" / "eval.sbatch").rmdir()
    (tmp_path / "jobs" / "eval.sbatch").write_text("#!/bin/bash\n")  # not executable: sbatch and bash read it
    assert load_specs([spec], preflight=True).evalruns


def test_a_job_script_on_the_login_node_is_not_looked_for_here(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(MISSING_SCRIPT.format(scheduler="{type: slurm, ssh: alice@login}", script="/home/alice/x.sbatch"))
    assert load_specs([spec], preflight=True).evalruns


TWO_CLUSTERS = """\
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {name: a}
spec: {scheduler: {type: slurm}, jobsDir: /j, logsDir: /l, jobScript: s.sbatch}
---
apiVersion: evalrun.io/v1alpha1
kind: ClusterEvalCluster
metadata: {name: b}
spec: {scheduler: {type: slurm}, jobsDir: /j, logsDir: /l, jobScript: s.sbatch}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {name: run}
spec:
  clusters: [a, {kind: ClusterEvalCluster, name: b}]
  models: [laion/Qwen3-8B-sft-v3]
  presets: [tb2]
  placement: {strategy: ordered, pin: [{models: ["laion/*"], cluster: b}]}
"""


def test_an_evalrun_may_name_several_clusters_in_spec_order(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(TWO_CLUSTERS)
    (tmp_path / "s.sbatch").write_text("#!/bin/bash\n")
    specs = load_specs([path], preflight=True)
    [run] = specs.evalruns
    a, b = ClusterRef(name="a"), ClusterRef(name="b", cluster_scoped=True)
    assert run.cluster_refs == [a, b]
    assert run.cluster_ref == a, "the first stays the run's cluster for single-cluster callers"
    assert [c.ref for c in specs.clusters_of(run)] == [a, b]
    assert specs.cluster_of(run).ref == a
    spec = run.run.spec
    assert (spec.cluster_kind, spec.cluster_name) == ("EvalCluster", "a")
    assert spec.placement is not None and spec.placement.strategy == "ordered"
    assert spec.pinned_to("LAION/Qwen3-8B-sft-v3") == "b", "globs match as namePatterns do: any case"
    assert spec.pinned_to("other/m") is None


def test_a_cluster_spec_with_one_cluster_keeps_its_single_list(tmp_path: Path) -> None:
    path = tmp_path / "one.yaml"
    path.write_text(TWO_CLUSTERS.replace("clusters: [a, {kind: ClusterEvalCluster, name: b}]", "cluster: a")
                    .replace("  placement: {strategy: ordered, pin: [{models: [\"laion/*\"], cluster: b}]}\n", ""))
    [run] = load_specs([path]).evalruns
    assert run.cluster_refs == [ClusterRef(name="a")] and run.run.spec.placement is None


def test_the_walltime_margin_is_checked_against_every_listed_cluster(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    short_b = "kind: ClusterEvalCluster\nmetadata: {name: b}\nspec: {timeLimit: '00:10:00', "
    path.write_text(TWO_CLUSTERS.replace("kind: ClusterEvalCluster\nmetadata: {name: b}\nspec: {", short_b))
    with pytest.raises(SpecErrors) as caught:
        load_specs([path])
    [error] = caught.value.errors
    assert (error.line, error.col) == (15, 3), str(error)
    assert "cluster b's timeLimit (00:10:00 = 10 min)" in error.message, str(error)
