# The two commands of the README, and a few helpers. Every target installs what it needs itself.
.PHONY: demo slurm-demo test bench bench-slurm bench-operator bench-store bench-incremental bench-output bench-catalog bench-foreign bench-fairness bench-remote bench-planner bench-placement bench-walltime bench-selector crds clean-demo kube-up kube-down

# Set up, then converge the local demo (3 models × 2 benchmarks) and print the grid.
demo:
	./scripts/bootstrap.sh
	.venv/bin/evalctl reconcile --loop --interval 1 --until-done -f specs/demo.yaml

# The same on the lab SLURM cluster (root: installs slurm-wlm + munge + MariaDB) with real Harbor.
slurm-demo:
	./scripts/bootstrap.sh
	./scripts/slurm-up.sh
	./scripts/eval-env.sh
	SLURM_CONF=$${SLURM_LAB:-/tmp/evalrun-slurm}/etc/slurm.conf .venv/bin/evalctl reconcile --loop --interval 5 \
		--until-done -f specs/lab/slurm-lab.yaml --store sqlite:///.evalctl/slurm-lab/store.db

# Set up, then lint, type-check and run the whole test suite.
test:
	./scripts/bootstrap.sh
	.venv/bin/ruff check .
	.venv/bin/mypy
	.venv/bin/pytest -n 3 --dist loadgroup --durations=25

# Plan-pass timings over a synthetic fleet (1,000 cells, 100,000 trial dirs); prints figures.
bench:
	./scripts/bootstrap.sh
	.venv/bin/python bench/plan_pass.py

# One pass's SLURM observation (1 squeue + 1 sacct) with 700 queued jobs on the lab cluster; prints figures.
bench-slurm:
	./scripts/bootstrap.sh
	./scripts/slurm-up.sh
	SLURM_CONF=$${SLURM_LAB:-/tmp/evalrun-slurm}/etc/slurm.conf .venv/bin/python bench/slurm_observe.py 700

# The store's share of a 2,000-cell pass on SQLite and on PostgreSQL (started by scripts/pg-up.sh); prints figures.
bench-store:
	./scripts/bootstrap.sh
	.venv/bin/python bench/store_pass.py

# Cold and warm run-dir observation over 1,000 run dirs × 100 trials (1% running), against their floors.
bench-incremental:
	./scripts/bootstrap.sh
	.venv/bin/python bench/incremental_pass.py

# A modelSelector over 20,000 models and 200,000 rows on the lab PostgreSQL: statements and time per pass.
bench-selector:
	./scripts/bootstrap.sh
	.venv/bin/python bench/selector.py

# plan() alone over 10,000 cells: fresh, finished and running.
bench-planner:
	./scripts/bootstrap.sh
	.venv/bin/python bench/planner.py

# Placement over 5 clusters, 10,000 cells (fresh and steady): the decision alone, and plan_lanes() beside plan().
bench-placement:
	./scripts/bootstrap.sh
	.venv/bin/python bench/placement.py

# The fixed 24 h walltime against walltime sized per cell (+ shards past 48 h): 200 cells replayed on a simulated
# 16-node EASY-backfill queue beside other users' jobs; prints makespan, GPU-hours, cuts and queue waits.
bench-walltime:
	./scripts/bootstrap.sh
	.venv/bin/python bench/walltime.py

# read_output over 500 running jobs' output files (growing, idle, a backlog), via SLURM's one command and locally.
bench-output:
	./scripts/bootstrap.sh
	.venv/bin/python bench/output_reading.py

# Every failure-catalog pattern on adversarial 256 KiB lines: the worst time per pattern, and diagnose per stage.
bench-catalog:
	./scripts/bootstrap.sh
	.venv/bin/python bench/catalog_patterns.py

# Operator figures on the lab API server: apply → first submission, and a 200 EvalRuns × 10 cells fleet.
bench-operator:
	./scripts/bootstrap.sh
	.venv/bin/python bench/operator_passes.py 200 10

# Regenerate the committed CRDs and the field reference (docs/reference.md) from the pydantic models.
crds:
	.venv/bin/evalctl crds > crds/evalrun.io_crds.yaml.tmp && mv crds/evalrun.io_crds.yaml.tmp crds/evalrun.io_crds.yaml
	.venv/bin/evalctl docs

# A real Kubernetes API server (etcd + kube-apiserver, RBAC, TLS) on 127.0.0.1:6443, built from Go modules once per machine.
kube-up:
	./scripts/kube-up.sh

kube-down:
	./scripts/kube-down.sh

clean-demo:
	rm -rf .evalctl/demo .evalctl/slurm-lab specs/.evalctl  # the demo's store is next to its spec

# A pass over a jobs dir of 100,000 foreign entries reads its own run dirs only: RSS over 50 passes; prints figures.
bench-foreign:
	./scripts/bootstrap.sh
	.venv/bin/python bench/foreign_entries.py

# Run dirs on a login node (the lab sshd) read by the probe at 0/1/10/50 ms added RTT, beside a local read; prints figures.
bench-remote:
	./scripts/bootstrap.sh
	./scripts/sshd-up.sh
	.venv/bin/python bench/remote_pass.py --sftp

# What a hostile namespace costs another one's first status and Ready; prints figures. HOSTILE=silent (silent ssh
# hosts and a FIFO), foreign (100,000 foreign run-dir entries) or cells (40 EvalRuns × 10,000 cells).
bench-fairness:
	./scripts/bootstrap.sh
	.venv/bin/python bench/operator_fairness.py --hostile $${HOSTILE:-silent}
