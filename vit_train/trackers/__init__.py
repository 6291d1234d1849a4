"""Experiment trackers: the runs W&B and MLflow keep of a vit-train run, one module each (`wandb`, `mlflow`),
both behind the `Tracker` protocol of `base`. Importing this package imports neither library: each tracker
imports its library in `start`, and a missing one is one line naming the extra that installs it."""
