"""Pinggy pairs on the real cluster: 3 installed-agent cells and 2 pairs → 2 run, 1 waits, it starts when a pair frees.

The job script holds each job at a gate file (one per run tag) so the test decides when a job ends; past the
gate it runs fake Harbor, which writes a complete run dir, so the ended cell uploads instead of resuming.
"""

from __future__ import annotations

import hashlib
import sqlite3
import sys
import uuid

import pytest

from tests.slurm.conftest import FAKE_HARBOR, SlurmCluster, slurm, wait_until

pytestmark = pytest.mark.slurm
PAIRS = {"pinggy-a": "https://a.pinggy.example", "pinggy-b": "https://b.pinggy.example"}


def leases(cluster: SlurmCluster) -> dict[str, str]:
    with sqlite3.connect(cluster.db) as conn:
        return dict(conn.execute("SELECT pair, holder FROM evalrun_tunnel_leases").fetchall())


def test_three_installed_agent_cells_share_two_pairs(cluster: SlurmCluster) -> None:
    tokens = {name: f"tok-{uuid.uuid4().hex}" for name in PAIRS}
    for name, token in tokens.items():
        cluster.env[f"EVALCTL_SECRET_{name.upper().replace('-', '_')}_TOKEN"] = token
    gates = cluster.root / "gates"
    gates.mkdir()
    digests = " ".join(hashlib.sha256(t.encode()).hexdigest() for t in tokens.values())
    script = cluster.script("gated.sbatch", f"""#!/bin/bash
while [ ! -e "{gates}/$4" ]; do sleep 0.2; done
digest=$(printf %s "$EVAL_PINGGY_TOKEN" | sha256sum | cut -c1-64)
case " {digests} " in *" $digest "*) echo "pinggy token ok for $EVAL_PINGGY_URL" ;; esac
exec "{sys.executable}" "{FAKE_HARBOR}" "$@"
""")
    pairs_yaml = "".join(f"\n      - {{name: {name}, url: '{url}', secretRef: {{name: {name}}}}}"
                         for name, url in PAIRS.items())
    cluster.write(models=[cluster.model(i) for i in range(3)], datasets=["DCAgent/pinggy_tiny"], script=script,
                  env={"FAKE_HARBOR_TASKS": "2", "FAKE_HARBOR_TRIAL_SECONDS": "0"},
                  extra_run=f"  monitor: {{preWalltimeMinutes: 1, settleMinutes: 0}}\n  pinggy:\n    pairs:{pairs_yaml}")
    cluster.spec.write_text(cluster.spec.read_text().replace("agent: oracle", "agent: openhands"))

    cluster.reconcile()
    first = cluster.submissions()
    assert len(first) == 2 and len(leases(cluster)) == 2
    assert set(leases(cluster)) == set(PAIRS) and set(leases(cluster).values()) == {s["name"] for s in first}
    [waiting] = [c for c in cluster.plan_cells() if c["phase"] == "Pending"]
    assert "free pinggy pair (2 of 2 in use" in waiting["actions"][0]["reason"]

    cluster.reconcile()  # both jobs still held at their gates: nothing frees, nothing new starts
    assert len(cluster.submissions()) == 2

    done = first[0]
    (gates / done["run_tag"]).touch()
    assert cluster.wait_job_final(done["job_id"]) == "COMPLETED"
    freed = next(pair for pair, holder in leases(cluster).items() if holder == done["name"])
    cluster.reconcile()
    third = [s for s in cluster.submissions() if s["name"] not in {f["name"] for f in first}]
    assert len(third) == 1, cluster.submissions()
    assert leases(cluster)[freed] == third[0]["name"], "the freed pair went to the waiting cell"
    assert done["name"] not in leases(cluster).values()

    output = (cluster.logs_dir / f"{done['name']}_{done['job_id']}.out").read_text()
    assert f"pinggy token ok for {PAIRS[freed]}" in output
    for sub in cluster.submissions():
        if sub["job_id"]:
            line = wait_until(lambda s=sub: slurm(["sacct", "-n", "-X", "-P", "-j", s["job_id"], "-o", "SubmitLine"],
                                                   cluster.env).stdout.strip(), f"sacct record of {sub['name']}")
            assert sub["name"] in line and not any(t in line for t in tokens.values()), "token in sbatch's argv"
    for path in [cluster.db, *cluster.root.rglob("*.out"), *cluster.jobs_dir.rglob("*")]:
        if path.is_file():
            assert not any(t.encode() in path.read_bytes() for t in tokens.values()), f"token written to {path}"
    for sub in cluster.submissions():
        (gates / sub["run_tag"]).touch()
    wait_until(lambda: all(cluster.job_state(s["job_id"]) == "COMPLETED" for s in cluster.submissions()),
               "every gated job to finish")
