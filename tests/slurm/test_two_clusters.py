"""One EvalRun over two real SLURM clusters (RULES §15): the default lab and a second one (`slurm_lab_b`), each with
its own controller, node, accounting and `maxLiveJobs: 2`, reached from one host through `scheduler.slurmConf`.

Every cell runs once, on one cluster, and the submission record says which; a cluster whose controller is down
keeps its cells Unknown (none moved, no duplicate once it is back) while new cells go to the other."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from tests.slurm.conftest import SlurmCluster, ensure_slurmctld_up, slurm, slurmctld, wait_until

pytestmark = pytest.mark.slurm
FAST = {"FAKE_HARBOR_TASKS": "2", "FAKE_HARBOR_TRIAL_SECONDS": "0.2"}
LAB_A, LAB_B = "lab-a", "lab-b"


def write(cluster: SlurmCluster, lab_b: dict[str, str], models: list[str], *, held: bool = False,
          pins: str = "") -> None:
    script = cluster.held_script() if held else cluster.fake_harbor_script()
    env = "".join(f"\n    {k}: {json.dumps(v)}" for k, v in FAST.items())
    clusters = ""
    for name, conf in ((LAB_A, cluster.env["SLURM_CONF"]), (LAB_B, lab_b["SLURM_CONF"])):
        clusters += f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: {name}}}
spec:
  scheduler: {{type: slurm, submissionsPerMinute: 600, slurmConf: {conf}}}
  partition: debug
  jobsDir: {cluster.root / name / "jobs"}
  logsDir: {cluster.root / name / "logs"}
  jobScript: {script}
  timeLimit: "10"
  maxLiveJobs: 2
  env:{env}
---"""
    cluster.spec.write_text(f"""{clusters}
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: two-clusters}}
spec:
  clusters: [{LAB_A}, {LAB_B}]
  models: {json.dumps(models)}
  datasets: [DCAgent/twobench]
  agent: oracle
  nAttempts: 1
  monitor: {{settleMinutes: 0, preWalltimeMinutes: 1}}
{pins}""")


def ours(cluster: SlurmCluster, env: dict[str, str]) -> list[tuple[str, str, str]]:
    """(id, name, state) of this test's jobs in one cluster's queue (squeue --states=all lists ended ones a while)."""
    out = slurm(["squeue", "-h", "--states=all", "-o", "%i|%j|%T"], env).stdout
    return [tuple(line.split("|")) for line in out.splitlines() if cluster.uid in line]  # type: ignore[misc]


def live(cluster: SlurmCluster, env: dict[str, str]) -> int:
    return sum(1 for _, _, state in ours(cluster, env) if state in ("PENDING", "RUNNING", "CONFIGURING"))


def per_cluster(cluster: SlurmCluster) -> Counter[str]:
    return Counter(r["cluster"] for r in cluster._query("SELECT cluster FROM evalrun_submissions"))


def cancel_ours(cluster: SlurmCluster, env: dict[str, str]) -> None:
    for job_id, _, _ in ours(cluster, env):
        slurm(["scancel", job_id], env, check=False)


@pytest.fixture
def both(cluster: SlurmCluster, slurm_lab_b: dict[str, str]):
    yield cluster, slurm_lab_b
    cancel_ours(cluster, slurm_lab_b)


def test_eight_cells_over_two_clusters_run_four_at_a_time_each_once(both) -> None:
    cluster, lab_b = both
    models = [cluster.model(i) for i in range(8)]
    write(cluster, lab_b, models)

    planned = cluster.plan_cells()
    placed = [c for c in planned if "; placed on lab-" in c["reason"]]
    assert Counter(c["cluster"] for c in placed) == {LAB_A: 2, LAB_B: 2}, planned
    assert [c["rule"] for c in planned if c not in placed] == ["NoFreeCluster"] * 4
    assert all(c["cluster"] is None and "no free slot on any cluster: lab-a: " in c["actions"][0]["reason"]
               for c in planned if c not in placed)

    explained = cluster.evalctl("explain", models[0], "DCAgent/twobench").stdout
    assert f"cluster: {next(c['cluster'] for c in planned if c['model'] == models[0])}\n" in explained, explained

    first = cluster.reconcile()
    assert "4 action(s) done" in first.stdout, first.stdout
    assert per_cluster(cluster) == {LAB_A: 2, LAB_B: 2}
    assert len(ours(cluster, cluster.env)) == 2 and len(ours(cluster, lab_b)) == 2

    seen: list[tuple[int, int]] = []

    def converged() -> bool:
        seen.append((live(cluster, cluster.env), live(cluster, lab_b)))
        assert max(seen[-1]) <= 2, f"live jobs per cluster at each observation: {seen}"
        cluster.reconcile()
        return cluster.status()["counts"] == {"Completed": 8}

    wait_until(converged, "all 8 cells Completed", timeout_s=600, step_s=1.0)

    rows = cluster.rows()
    assert len(rows) == 8 and len({r["job_name"] for r in rows}) == 8, "one row per cell"
    assert all(r["job_status"] == "Finished" for r in rows)
    subs = cluster._query("SELECT run_tag, job_id, cluster FROM evalrun_submissions")
    assert len(subs) == 8 and {s["cluster"] for s in subs} == {LAB_A, LAB_B}
    for sub in subs:  # each job is in the accounting of the cluster its record names, and only there
        home, other = (cluster.env, lab_b) if sub["cluster"].endswith(LAB_A) else (lab_b, cluster.env)
        assert [j for j in ours(cluster, home) if j[1] == sub["run_tag"]] or slurm(
            ["sacct", "-n", "-X", "-j", sub["job_id"], "-o", "JobName%80"], home).stdout.strip() == sub["run_tag"]
        assert sub["run_tag"] not in slurm(["sacct", "-n", "-X", "-S", "now-1hour", "-o", "JobName%80"],
                                           other).stdout
    assert "0 action(s) done" in cluster.reconcile().stdout

    audit = cluster.evalctl("db", "audit", "-f", str(cluster.spec), "--store", cluster.store, "-o", "json",
                            check=False)
    judged = json.loads(audit.stdout)  # each row by its run dir, on whichever cluster it ran
    assert (judged["audited"], judged["not_auditable"]) == (8, 0), audit.stdout + audit.stderr
    assert {r["run_tag"] for r in judged["rows"]} == {s["run_tag"] for s in subs}


def test_a_cluster_whose_controller_is_down_keeps_its_cells_unknown_and_new_ones_go_elsewhere(
        cluster: SlurmCluster, slurm_lab_b_alone: dict[str, str]) -> None:
    lab_b = slurm_lab_b_alone
    models = [cluster.model(i) for i in range(4)]
    pins = f"  placement: {{pin: [{{models: [{models[0]}], cluster: {LAB_A}}}, {{models: [{models[1]}], cluster: {LAB_B}}}]}}\n"
    write(cluster, lab_b, models[:2], held=True, pins=pins)  # held jobs: queued, never running, never done
    try:
        assert "2 action(s) done" in cluster.reconcile().stdout
        assert per_cluster(cluster) == {LAB_A: 1, LAB_B: 1}
        on_b = [name for _, name, _ in ours(cluster, lab_b)]
        stopped = slurmctld("stop", lab_b)
        assert stopped.returncode == 0, stopped.stderr
        write(cluster, lab_b, models, held=True, pins=pins)

        blind = cluster.reconcile(check=False)

        assert blind.returncode == 3, blind.stderr  # a source not observed
        assert "lab-b" in blind.stderr and "queue not observed" in blind.stderr
        assert per_cluster(cluster) == {LAB_A: 2, LAB_B: 1}, \
            "a new cell took lab-a's last slot; the one on lab-b was not moved"
        cells = {c["model"]: c for c in cluster.status(code=3)["cells"]}
        [job_on_b] = on_b
        assert [m for m, c in cells.items() if c["phase"] == "Unknown"] == \
            [m for m in models if f"{m.split('/')[1]}__" in job_on_b], cells
        assert cells[models[3]]["rule"] == "NoFreeCluster"
        assert "lab-b: not observed (" in cells[models[3]]["actions"][0]["reason"], cells[models[3]]
    finally:
        ensure_slurmctld_up(lab_b)
    try:
        back = cluster.reconcile()
        assert per_cluster(cluster) == {LAB_A: 2, LAB_B: 2}, f"once back, lab-b takes the waiting cell: {back}"
        names_on_b = [name for _, name, _ in ours(cluster, lab_b)]
        assert len(names_on_b) == 2 and names_on_b.count(job_on_b) == 1, "no duplicate of the job it kept"
    finally:
        cancel_ours(cluster, lab_b)


def partition(env: dict[str, str], state: str) -> None:
    slurm(["scontrol", "update", "PartitionName=debug", f"State={state}"], env)


def test_a_down_partition_gets_no_new_cell_and_its_queued_job_spills_once_whatever_step_is_killed(
        cluster: SlurmCluster, slurm_lab_b_alone: dict[str, str]) -> None:
    lab_b = slurm_lab_b_alone
    models = [cluster.model(i) for i in range(2)]
    ordered = "  placement: {strategy: ordered, spillAfterMinutes: 1}\n"

    def spec(names: list[str]) -> None:
        write(cluster, lab_b, names, pins=ordered)
        text = cluster.spec.read_text()  # lab-b first: where `ordered` sends a cell while it takes jobs
        cluster.spec.write_text(text.replace(f"clusters: [{LAB_A}, {LAB_B}]", f"clusters: [{LAB_B}, {LAB_A}]"))

    partition(lab_b, "DOWN")
    try:
        spec(models[:1])
        assert "1 action(s) done" in cluster.reconcile().stdout
        [(stuck, stuck_name, _)] = ours(cluster, lab_b)
        wait_until(lambda: "PartitionDown" in slurm(["squeue", "-h", "-j", stuck, "-o", "%r"], lab_b).stdout,
                   "lab-b's scheduler to say why the job waits")

        spec(models)  # a new cell: lab-b first in the order, but its partition takes nothing
        cluster.reconcile()
        assert per_cluster(cluster) == {LAB_B: 1, LAB_A: 1}
        moved = next(c for c in cluster.plan_cells() if c["model"] == models[1])
        assert moved["cluster"] == LAB_A

        queued_since = datetime.now(UTC)  # the job was submitted before this: a minute from now it is overdue
        wait_until(lambda: datetime.now(UTC) - queued_since > timedelta(seconds=61), "spillAfterMinutes to pass",
                   timeout_s=120, step_s=1.0)
        for step in ("after-remember", "after-cancel", "after-intent", "after-submit"):
            cluster.evalctl("reconcile", "--once", kill_at=step)
        cluster.reconcile()

        accounted = slurm(["sacct", "-n", "-P", "-X", "-j", stuck, "-o", "State,Start"], lab_b).stdout.split("|")
        assert accounted[0].startswith("CANCELLED") and accounted[1].strip() in ("None", "Unknown"), accounted
        names_a = [name for _, name, _ in ours(cluster, cluster.env)]
        assert sorted(names_a) == sorted(set(names_a)), f"one job per name on lab-a: {names_a}"
        assert f"{stuck_name}-r1" in names_a, "the spilled run went to lab-a as its next fire"
        assert [name for _, name, _ in ours(cluster, lab_b)] == [stuck_name], "nothing new on lab-b"
        records = cluster._query("SELECT name, cluster FROM evalrun_submissions ORDER BY created_at")
        assert [(r["name"], r["cluster"]) for r in records if r["name"].startswith(stuck_name)] == \
            [(stuck_name, LAB_B), (f"{stuck_name}-r1", LAB_A)]

        def converged() -> bool:
            cluster.reconcile()
            return cluster.status()["counts"] == {"Completed": 2}

        wait_until(converged, "both cells Completed on lab-a", timeout_s=300, step_s=1.0)
        assert len(cluster.rows()) == 2
    finally:
        partition(lab_b, "UP")
        cancel_ours(cluster, lab_b)
