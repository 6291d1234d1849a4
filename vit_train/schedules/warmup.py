"""The linear warmup every schedule starts with (schedule.warmup_epochs)."""


def warmup_factor(step: int, warmup_steps: int) -> float:
    """The multiplier of the peak lr for optimiser step `step` (0-based) of a warmup of `warmup_steps`: rises
    linearly to 1 at step warmup_steps - 1."""
    return (step + 1) / warmup_steps
