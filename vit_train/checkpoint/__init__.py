"""What crosses a restart, and every file weights are read from: the one owner of the checkpoint.

What a checkpoint holds (contents.py, docs/resuming.md 'What is in a checkpoint'): the model's weights under
timm's names, the optimiser (with its parameters' names), the LR schedule, the grad scaler, the EMA, the loop's
position in images (state.py `TrainState`: the smallest state resume needs), every RNG's state, the objective's
own state, the train row's window, the resolved config, the class names, the run id and identity record, the
preprocessing and the versions; a plain dict of tensors and primitives.

How it is written (saving.py): to a temporary file beside it, fsynced, verified (every record's CRC, then loaded
back), renamed; its other names (step_<N>.pt, best.pt) linked after, the rotation last; a save a kill cut short is
completed on resume. How it is read (files.py, weights.py): every record's CRC checked, loaded with
`weights_only=True` (integrity.py says in words why a file cannot be), refused in one line when a newer vit-train
wrote it, an earlier version's read as this version writes it (contents.py `upgraded`), its identity checked
against itself (weights.py `check_record`) and against the run directory it is in (identity.py `mixed_runs`).

The other modules ask this door (`from vit_train.checkpoint import ...`); none opens a checkpoint or weights file
itself (the one torch.save is saving.py's, the one torch.load files.py `read_archive`, the one safetensors read
weights.py `read_weights`), and none imports the rooms behind it.
"""

from vit_train.checkpoint.contents import (
    FORMAT_VERSION,
    REQUIRED_KEYS,
    checkpoint_state,
    ema_weights,
    position_from_batches,
    restore,
    restore_ema,
    restore_loop,
    restore_weights,
    saved_ema,
    upgraded,
    versions,
)
from vit_train.checkpoint.files import (
    NewerCheckpoint,
    checkpoint_file,
    find_resume_checkpoint,
    load_checkpoint,
    run_checkpoints,
    saved_step,
    step_files,
)
from vit_train.checkpoint.hub import FILES as HUB_FILES
from vit_train.checkpoint.hub import timm_layout
from vit_train.checkpoint.identity import (
    check_classes,
    class_difference,
    eval_score,
    mixed_runs,
    mixed_text,
    new_run_id,
    recorded_run_ids,
    run_id_of,
    shown_classes,
    weights_identity,
)
from vit_train.checkpoint.integrity import load_failure
from vit_train.checkpoint.optimizer import load_optimizer_state, param_names
from vit_train.checkpoint.saving import (
    complete_save,
    copy_checkpoint,
    earlier_checkpoint,
    repair_run_checkpoints,
    save_checkpoint,
    save_run_checkpoint,
    short_of_space,
)
from vit_train.checkpoint.scores import best_weights, better, checkpoint_best, scored_by, shown, winner
from vit_train.checkpoint.state import TrainState, restore_rng, rng_state
from vit_train.checkpoint.weights import (
    INPUTS,
    Incoming,
    check_record,
    describe,
    export_safetensors,
    exported_folder,
    load_weights,
    open_weights,
    read_weights,
    resolve,
)

__all__ = [
    "FORMAT_VERSION",
    "HUB_FILES",
    "INPUTS",
    "REQUIRED_KEYS",
    "Incoming",
    "NewerCheckpoint",
    "TrainState",
    "best_weights",
    "better",
    "check_classes",
    "check_record",
    "checkpoint_best",
    "checkpoint_file",
    "checkpoint_state",
    "class_difference",
    "complete_save",
    "copy_checkpoint",
    "describe",
    "earlier_checkpoint",
    "ema_weights",
    "eval_score",
    "export_safetensors",
    "exported_folder",
    "find_resume_checkpoint",
    "load_checkpoint",
    "load_failure",
    "load_optimizer_state",
    "load_weights",
    "mixed_runs",
    "mixed_text",
    "new_run_id",
    "open_weights",
    "param_names",
    "position_from_batches",
    "read_weights",
    "recorded_run_ids",
    "repair_run_checkpoints",
    "resolve",
    "restore",
    "restore_ema",
    "restore_loop",
    "restore_rng",
    "restore_weights",
    "rng_state",
    "run_checkpoints",
    "run_id_of",
    "save_checkpoint",
    "save_run_checkpoint",
    "saved_ema",
    "saved_step",
    "scored_by",
    "short_of_space",
    "shown",
    "shown_classes",
    "timm_layout",
    "step_files",
    "upgraded",
    "versions",
    "weights_identity",
    "winner",
]
