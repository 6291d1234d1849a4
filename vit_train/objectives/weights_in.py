"""The one door for weights that come from another run or another program: `model.pretrained`,
`distill.teacher`, and vit-eval / vit-predict / vit-export's `ckpt` all open their weights here, so
each accepts the same inputs, takes the same weights by the same rule, says the same things in the log
and refuses the same mismatches (resume checks the run and the config in train/resume.py).

Inputs: a vit-train checkpoint (.pt), a run directory or its checkpoints/ folder (its best.pt, else its
newest readable checkpoint), a .safetensors file (vit-export's carries the identity; others are plain),
or a plain state dict (.pth/.pt; DeiT's {"model": ...}, Lightning's {"state_dict": ...}), from
vit-train, timm or torchvision, with `module.` and `_orig_mod.` wrapper prefixes in any order removed.

Which weights: from a vit-train checkpoint, weights=auto takes the set that scored better at its last
evaluation, the model winning a tie (objectives/score.py `best_weights`, as best.pt is chosen);
model/ema take that set. A file that holds one set (safetensors, plain) has no choice to make.

Identity (models/architecture.py `identity`): vit-train files carry the run id, the objective, the
architecture and the class names; the door compares them with what the weights go into:
`check_architecture` (every field that changes the function, naming the keys to set) and
`check_classes` (the first differing class). Foreign files are compared on what their tensors
reveal (models/architecture.py `revealed`: not the head count, not sin-cos positions).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vit_train.data.decoding.regular import not_regular
from vit_train.errors import CheckpointError, ConfigError
from vit_train.models.architecture import (architecture, differences, differing, head_classes, identity,
                                           positions_exempt, revealed)
from vit_train.objectives.score import best_weights
from vit_train.outputs.checkpoint import checkpoint_file
from vit_train.outputs.identity import class_difference, mixed_runs, mixed_text, run_id_of, shown_classes
from vit_train.outputs.weights import ema_weights, eval_score, read_weights, strip_wrappers
from vit_train.schema.typed import options

log = logging.getLogger("vit_train")

INPUTS = "a vit-train run directory or checkpoint (.pt), a .safetensors file, or a timm, DeiT or torchvision state dict"


@dataclass
class Incoming:
    """Weights that came in by one door, and what is known of them."""

    key: str  # the user's key or argument: "model.pretrained", "distill.teacher", "ckpt"
    given: str  # its value as the user gave it
    path: Path  # the file read
    weights: dict[str, torch.Tensor]  # the set taken, wrapper prefixes removed (names otherwise as in the file)
    source: str  # "model", "ema" (a vit-train checkpoint's or export's), or "file" (a file of one unnamed set)
    why: str  # why this set, in words (the log says it)
    identity: dict[str, Any] | None  # models/architecture.py's record plus weights/step/score; None: foreign
    config: dict[str, Any] | None  # the run config the file carries (vit-train checkpoints and exports)
    checkpoint: dict[str, Any] | None  # the whole vit-train checkpoint, when the file is one
    metadata: dict[str, Any] | None = None  # a .safetensors file's (JSON-decoded), e.g. vit-export's preprocessing

    @property
    def class_names(self) -> list[str] | None:
        return (self.identity or {}).get("class_names")

    @property
    def architecture(self) -> dict[str, Any]:
        """The recorded architecture, else what the tensors reveal."""
        if self.identity and self.identity.get("architecture"):
            return self.identity["architecture"]
        return revealed(self.weights)


def resolve(given: str | Path, key: str) -> Path:
    """The file `given` names (the same rule at every door): a file is itself; a run directory or its
    checkpoints/ folder gives its best.pt, else its newest readable checkpoint (else a best.pt or last.pt
    that is no vit-train checkpoint, read as weights). ConfigError (one line) when there is none."""
    path = Path(given).expanduser()
    if path.is_dir():
        if not ((path / "checkpoints").is_dir() or path.name == "checkpoints"):
            raise ConfigError(f"{key}={given} is a directory but no vit-train run directory (it has no checkpoints/); "
                              f"give {INPUTS}")
        folder = path if path.name == "checkpoints" else path / "checkpoints"
        try:
            path = checkpoint_file(path)
        except CheckpointError as e:  # none reads as a vit-train checkpoint: a weights file saved there by hand?
            plain = next((p for p in (folder / "best.pt", folder / "last.pt") if p.is_file()), None)
            if plain is None:
                raise ConfigError(f"{key}={given}: {e}") from None
            path = plain
    kind = not_regular(path)  # never opened when not a regular file: a FIFO would block the read forever
    if kind == "missing":
        raise ConfigError(f"{key}={given} does not exist; give {INPUTS}")
    if kind is not None:
        raise ConfigError(f"{key}={given} is {kind}, not a file to read weights from; give {INPUTS}")
    return path


def open_weights(given: str | Path, key: str, weights: str = "auto", said_as: str | None = None) -> Incoming:
    """Read the weights `given` names and take one set of them (`weights`: auto, model or ema), logging
    which and why in one line that starts with `said_as` (default "<key>=<given>"). Raises ConfigError/CheckpointError (one line) for a missing, unreadable or foreign file,
    or a set the file does not hold."""
    if weights not in ("auto", "model", "ema"):
        raise ConfigError(f"weights must be auto, model or ema; got {weights!r}")
    path = resolve(given, key)
    try:
        state, metadata, ckpt = read_weights(path)
    except CheckpointError as e:  # say which key named the file, and what it takes
        raise CheckpointError(f"{key}={given}: {e}; give {INPUTS}") from None
    config = metadata.get("config")  # a run config names its network; another tool's "config" metadata does not
    config = config if isinstance(config, dict) and isinstance(config.get("model"), dict) else None
    if ckpt is not None:
        source, why = _checkpoint_choice(ckpt, path, weights)
        state = ema_weights(ckpt["ema"]) if source == "ema" else ckpt["model"]
        record = ckpt.get("identity") or identity(ckpt["config"], ckpt.get("class_names"), run_id_of(ckpt))
        record = {**record, "weights": source, "step": ckpt.get("step"), "score": eval_score(ckpt, source)}
    else:
        record = metadata.get("identity")
        if record is None and config is not None:  # exports written before the identity record
            record = {**identity(config, metadata.get("class_names"), None), "weights": metadata.get("weights")}
        source = (record or {}).get("weights") or "file"
        if weights != "auto" and source != weights:
            raise CheckpointError(f"{key}={given} holds only {'the ' + source if source != 'file' else 'one set of'} "
                                  f"weights, not the {weights}'s; use weights=auto or weights={source}"
                                  if source != "file" else f"{key}={given} is a plain weights file; weights=auto")
        why = "the only set the file holds"
    incoming = Incoming(key, str(given), path, strip_wrappers(state), source, why, record, config, ckpt, metadata)
    if record is not None:
        check_record(incoming, ckpt.get("class_names") if ckpt is not None else metadata.get("class_names"))
    if Path(given).expanduser().is_dir():  # a run directory's best.pt: of that run, not another one's put there
        run_dir = path.parent.parent
        found = mixed_runs(run_dir, path, (record or {}).get("run_id"))
        if found is not None:
            raise CheckpointError(f"{key}={given}: {mixed_text(run_dir, *found)}; move {', '.join(found[0])} out of "
                                  f"it, or give the checkpoint you mean (a .pt file)")
    log.info("%s", describe(incoming, said_as))
    return incoming


def check_record(incoming: Incoming, class_names: Any) -> None:
    """CheckpointError (one line) when a file's identity record is malformed or contradicts the file: its
    class names or architecture against the file's own class names and config, or against what its
    tensors show (their shapes, the head's class count). A file edited by hand, or by another tool."""
    record, said = incoming.identity, f"{incoming.key}={incoming.given}"
    names, arch = record.get("class_names") if isinstance(record, dict) else None, \
        record.get("architecture") if isinstance(record, dict) else None
    if not isinstance(record, dict) or not isinstance(arch, (dict, type(None))) or not (
            names is None or isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise CheckpointError(f"{said}: its identity record is malformed (architecture a mapping, class_names a list of "
                              f"names); the file was edited or not written by vit-train: do not use it as it is")
    found = []
    if names is not None and isinstance(class_names, list) and class_difference(class_names, names) is not None:
        found.append(f"its class names differ from the record's ({class_difference(names, class_names, 'in the record', 'in the file')})")
    if arch and incoming.config is not None:
        found += [f"{key}={a} in the record, {b} in its config"
                  for key, a, b in differing(arch, architecture(incoming.config["model"]))]
    tensors = {k.removeprefix("encoder."): v for k, v in incoming.weights.items() if not k.startswith("decoder.")}
    if arch:
        shown = revealed(tensors)
        found += [f"{key}={a} in the record, {b} in its tensors"
                  for key, a, b in differing(arch, shown, positions_exempt(shown, arch))]
    heads = head_classes(tensors)
    if names is not None and heads is not None and heads != len(names):
        found.append(f"its head has {heads} outputs for the record's {len(names)} class names")
    if found:
        raise CheckpointError(f"{said} contradicts itself: {'; '.join(found)}; the file was edited or damaged: do not "
                              f"use it as it is")


def _checkpoint_choice(ckpt: dict, path: Path, weights: str) -> tuple[str, str]:
    if weights == "ema" and not ckpt.get("ema"):
        raise CheckpointError(f"{path} has no EMA weights (the run had trainer.ema_decay=null); use weights=model")
    if weights != "auto":
        return weights, "asked for"
    return best_weights(ckpt)


def describe(incoming: Incoming, said_as: str | None = None) -> str:
    """The log line of a door: which file, which weights and why, where they come from."""
    record, said_as = incoming.identity, said_as or f"{incoming.key}={incoming.given}"
    if record is None:
        where = f" {incoming.path}," if str(incoming.path) != incoming.given else ""
        return (f"{said_as}:{where} a state dict without a vit-train identity: its "
                f"class names, attention heads, activation (GELU or a variant) and the pooling of a model without "
                f"a class token (mean or max) cannot be checked, only its tensors' names, shapes and positions")
    which = {"ema": "the EMA weights", "model": "the model's weights"}.get(incoming.source, "its weights")
    where = f" of {incoming.path}" if str(incoming.path) != incoming.given else ""
    run = f" (run {record['run_id'][:8]})" if record.get("run_id") else ""
    step = f" at step {record['step']}" if record.get("step") is not None else ""
    trained_by = options("objective").get(record.get("objective"))  # an MAE run reads no labels: no classes said
    reads = trained_by is None or trained_by.reads_labels
    classes = f"; classes {shown_classes(record['class_names'])}" if record.get("class_names") and reads else ""
    return f"{said_as}: {which}{where}{run}{step}, as {incoming.why}{classes}"


def check_architecture(incoming: Incoming, ours: dict[str, Any], exempt: tuple[str, ...] = (),
                       theirs: dict[str, Any] | None = None) -> None:
    """ConfigError (one line) when the weights' architecture (`theirs`, default `incoming.architecture`)
    differs from `ours` (models/architecture.py, of the network they go into) in a field that changes the
    function and is not `exempt`, naming each field with the file's value and ours."""
    found = differences(incoming.architecture if theirs is None else theirs, ours, exempt)
    if found:
        settings = " ".join(f.split(" (")[0] for f in found if f.startswith("model.") and "a ResNet" not in f)
        size = ((incoming.config or {}).get("model") or {}).get("img_size")
        if size and any(f.startswith("model.patch_size=") for f in found):  # keep its token count, and its cost
            settings += f" model.img_size={size}"
        shown = incoming.architecture if theirs is None else theirs
        # another width from a file that cannot show its head count: the line alone would split its qkv wrongly
        heads = ", and model.num_heads as the weights were trained (their tensors cannot show it)" \
            if "model.num_heads" not in shown and any(f.startswith("model.embed_dim=") for f in found) else ""
        raise ConfigError(f"{incoming.key}={incoming.given} holds another network: {', '.join(found)}; "
                          f"{'set ' + settings + ' to load it' + heads if settings else 'give weights of this network'} "
                          f"(loaded into this one it would compute another function)")


def check_classes(incoming: Incoming, class_names: list[str], advice: str) -> bool:
    """Whether the weights' recorded class names equal `class_names` (same names, same order). When they
    differ, ConfigError (one line) naming the first difference and `advice` (what to do), unless `advice`
    is empty (the caller re-initialises the head, as the user asked): then False. True when they agree
    or when the file records no class names (foreign files: unknown, logged)."""
    theirs = incoming.class_names
    if theirs is None:
        return True
    difference = class_difference(theirs, class_names)
    if difference is None:
        return True
    if not advice:
        return False
    raise ConfigError(f"{incoming.key}={incoming.given} was trained on other classes than this data's: {difference}; "
                      f"{advice}")


# the option fields models/pretrained.py `check_options` refuses with the value to set; the distillation
# token and head are head-like: dropped, or freshly initialised, and reported
PRETRAINED_EXEMPT = ("model.distilled", "model.init_values", "model.qk_norm", "model.reg_tokens")


def load_pretrained(model: torch.nn.Module, given: str | Path, class_names: list[str] | None = None,
                    reset_head: bool = False) -> dict[str, list[str]]:
    """`model.pretrained`: the weights `given` names, through the door, into `model` (the classifier, or
    a masked autoencoder's encoder); returns what happened to each key (models/pretrained.py
    `fit_pretrained`).

    Refused (ConfigError, one line, nothing loaded): another architecture (every differing field named),
    a head trained on other classes than `class_names` (the data's; from a file that records them) or, for
    files that record none, on another number of classes, unless `reset_head` (model.reset_head=true:
    fine-tuning to new classes re-initialises the heads)."""
    from vit_train.models.architecture import architecture_of, head_classes
    from vit_train.models.pretrained import fit_pretrained, timm_names

    incoming = open_weights(given, "model.pretrained")
    weights, naming = timm_names(incoming.weights)
    theirs = incoming.identity["architecture"] if incoming.identity and incoming.identity.get("architecture") \
        else revealed(weights)
    ours = architecture_of(model)
    check_architecture(incoming, ours, PRETRAINED_EXEMPT + positions_exempt(theirs, ours), theirs)
    new_head = _new_head(incoming, head_classes(weights), head_classes(model.state_dict()), class_names, reset_head)
    return fit_pretrained(model, weights, naming, incoming.config, str(incoming.path), new_head)


def _new_head(incoming: Incoming, theirs: int | None, ours: int | None, class_names: list[str] | None,
              reset_head: bool) -> bool:
    """Whether the heads start fresh: only when asked (model.reset_head=true), or when there is no head to
    keep on one side (a masked autoencoder's encoder, a headless export). Refuses a head of other classes."""
    if theirs is None or ours is None:
        return False
    if reset_head:
        return True
    fix = "add model.reset_head=true to fine-tune to these classes with a new head"
    if class_names is not None and incoming.class_names is not None:
        check_classes(incoming, class_names, fix)
    elif theirs != ours:
        raise ConfigError(f"{incoming.key}={incoming.given} has a head for {theirs} classes and the data has {ours}; "
                          f"{fix}")
    elif incoming.class_names is None:
        log.info("%s records no class names: its head (%d classes, as many as the data's) is kept, and whether they "
                 "are these classes in this order cannot be checked (model.reset_head=true starts a new head)",
                 incoming.key, theirs)
    return False


def first_difference(error: RuntimeError) -> str:
    """load_state_dict's error in one short line: the first few missing or unexpected keys, or the shape."""
    lines = str(error).splitlines()
    detail = lines[1].strip() if len(lines) > 1 else str(error)
    return detail if len(detail) <= 200 else detail[:200].rsplit(",", 1)[0] + ", ...\""
