"""Experiment-tracker adapters (the `Tracker` port): where post-eval metrics go, and are read back from."""
