"""Code that runs beside the training loop: the callback API (base.py), the runner that calls a run's callbacks
(runner.py), early stopping (early_stopping.py), the trackers' adapter (trackers.py) and the TensorBoard logger
option (tensorboard.py). No torch at the top of any of them: the registry imports the option modules."""
