"""Run the real `vit-train` command line in this process and send a stop signal to its whole process
group (loader workers included, as SLURM and a terminal do) at one exact moment, chosen by patching
the function that runs there. Used by test_group_signals.py, in a child started in a new session:

    python tests/helpers/group_signal.py '{"where": "eval", "n": 1, "signal": "TERM"}' key=value ...

Under torchrun (`torchrun ... tests/helpers/group_signal.py SPEC ARGS`) rank 0 sends it at an evaluation.

Moments (the n-th occurrence):
  eval        during an evaluation, after its first batch's forward (the workers have prefetched more)
  eval_step   during the training forward of a step whose evaluation follows
  save        while a checkpoint is written (inside save_run_checkpoint, before it writes)
  loader      at the training loader's start-up, from a worker as it starts (the others may still start)
  figures     during the figure work after an evaluation (trainer.viz_every)
  build       while the run is built (its data built, before the model, the teacher and the loop)
"""

import json
import os
import signal
import sys
from pathlib import Path

if not __package__:  # run as a script: tests/ first on the path (not helpers/, whose module names are common)
    sys.path[0] = str(Path(__file__).resolve().parents[1])


def arm(where: str, n: int, signum: int) -> None:
    """Patch the function that runs at `where` so that its n-th call signals the whole process group."""
    count = {"n": 0}

    def signal_on_nth() -> None:
        count["n"] += 1
        if count["n"] == n:
            os.killpg(os.getpgid(0), signum)

    if where in ("eval", "eval_step"):
        from vit_train.models.vit import VisionTransformer

        forward = VisionTransformer.forward

        def signalling_forward(self, x):
            out = forward(self, x)
            if self.training == (where == "eval_step"):
                if where == "eval_step" or (os.getpid() == main_pid and os.environ.get("RANK", "0") == "0"):
                    signal_on_nth()
            return out

        VisionTransformer.forward = signalling_forward
    elif where == "save":
        import vit_train.train.trainer as trainer

        real_save = trainer.save_run_checkpoint

        def save_run_checkpoint(*args, **kwargs):
            signal_on_nth()
            return real_save(*args, **kwargs)

        trainer.save_run_checkpoint = save_run_checkpoint
    elif where == "loader":
        import vit_train.data.loaders as data

        real_init = data._worker_signals

        def worker_signals(worker_id: int) -> None:
            real_init(worker_id)
            if worker_id == 0:  # each worker counts for itself (a forked copy): n counts loader start-ups
                marker = Path(os.environ["GROUP_SIGNAL_MARK"])
                starts = int(marker.read_text() or 0) + 1 if marker.exists() else 1
                marker.write_text(str(starts))
                if starts == n:
                    os.killpg(os.getpgid(0), signum)

        data._worker_signals = worker_signals
    elif where == "build":
        from vit_train.data.sources.base import DataSource

        real_build = DataSource.build

        def build(*args, **kwargs):
            data = real_build(*args, **kwargs)
            signal_on_nth()
            return data

        DataSource.build = build  # every random-access data set's door (shapes in these runs)
    elif where == "figures":
        from vit_train.viz.figures import TrainingVisuals as Visuals

        real_after = Visuals.after_eval

        def after_eval(self, *args, **kwargs):
            signal_on_nth()
            return real_after(self, *args, **kwargs)

        Visuals.after_eval = after_eval
    else:
        raise SystemExit(f"unknown moment {where}")


main_pid = os.getpid()

if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    arm(spec["where"], spec.get("n", 1), getattr(signal, "SIG" + spec.get("signal", "TERM")))
    from vit_train.cli.train import train_main

    sys.argv = ["vit-train", *sys.argv[2:]]
    train_main()
    print("ended without the signal")
