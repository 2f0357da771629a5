"""The infrastructure smoke tests use the session fixtures `slurm_env` and `eval_env` of tests/conftest.py
(a real single-node SLURM cluster and the Harbor eval env), shared with tests/slurm."""
