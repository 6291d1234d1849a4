"""The summary of a sweep directory: the same as the `vit-sweep-summary` command.

    python scripts/sweep_summary.py outputs/multirun/2026-11-29/13-05-12 [--objective final_loss]
"""

from vit_train.sweeps.summary import main

if __name__ == "__main__":
    main()
