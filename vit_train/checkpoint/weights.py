"""Weights from any file vit-train accepts, and the one door they come in by: `model.pretrained`,
`objective.teacher`, and vit-eval / vit-predict / vit-export's `ckpt` all open their weights here
(`open_weights`), so each accepts the same inputs, takes the same weights by the same rule, says the same
things in the log and refuses the same mismatches (a resume checks the run and the config in train/resume.py;
what weights must be to go into a model, objectives/weights_in.py).

Inputs: a vit-train checkpoint (.pt), a run directory or its checkpoints/ folder (its best.pt, else its
newest readable checkpoint), a .safetensors file (vit-export's carries the identity; others are plain),
or a plain state dict (.pth/.pt; DeiT's {"model": ...}, Lightning's {"state_dict": ...}), from
vit-train, timm or torchvision, with `module.` and `_orig_mod.` wrapper prefixes in any order removed.

Which weights: from a vit-train checkpoint, weights=auto takes the set that scored better at its last
evaluation, the model winning a tie (scores.py `best_weights`, as best.pt is chosen); model/ema take that
set. A file that holds one set (safetensors, plain) has no choice to make.

Identity (models/architecture.py `identity`): vit-train files carry the run id, the objective, the
architecture and the class names; the door checks that a file agrees with itself (`check_record`);
objectives/weights_in.py compares the record with what the weights go into. Foreign files are compared on
what their tensors reveal (models/architecture.py `revealed`: not the head count, not sin-cos positions).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vit_train.checkpoint.contents import ema_weights, upgraded
from vit_train.checkpoint.files import NewerCheckpoint, checkpoint_file, read_archive, refuse_newer
from vit_train.checkpoint.hub import (
    WEIGHTS,
    hub_contradictions,
    hub_model,
    hub_record,
    is_hub_folder,
    missing_files,
    read_config,
)
from vit_train.checkpoint.identity import (
    class_difference,
    eval_score,
    mixed_runs,
    mixed_text,
    run_id_of,
    shown_classes,
    weights_identity,
)
from vit_train.checkpoint.integrity import archive_damage, legacy_damage, load_failure
from vit_train.checkpoint.scores import best_weights
from vit_train.data.decoding.regular import not_regular
from vit_train.errors import CheckpointError, ConfigError
from vit_train.extras import require
from vit_train.models.architecture import architecture, differing, head_classes, identity, positions_exempt, revealed
from vit_train.outputs.weights import save_safetensors, strip_wrappers
from vit_train.schema.typed import options

log = logging.getLogger("vit_train")

INPUTS = (
    "a vit-train run directory or checkpoint (.pt), a .safetensors file, a Hub folder (config.json, model.safetensors), "
    "or a timm, DeiT or torchvision state dict"
)


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
    if path.is_dir() and is_hub_folder(path):  # timm's save_for_hf layout (vit-export format=hf writes it too)
        missing = missing_files(path)
        if missing:
            other = next((f.name for f in sorted(path.glob("*.bin")) + sorted(path.glob("*.pth"))), None)
            raise ConfigError(
                f"{key}={given} is a Hub folder without {' and '.join(missing)} (timm's save_for_hf writes "
                f"config.json beside model.safetensors with safe_serialization=True)"
                + (f"; its {other} is a plain state dict: give {key}={path / other}" if other else "")
            )
        return path
    if path.is_dir():
        if not ((path / "checkpoints").is_dir() or path.name == "checkpoints"):
            raise ConfigError(
                f"{key}={given} is a directory but no vit-train run directory (it has no checkpoints/); give {INPUTS}"
            )
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
    """Read the weights `given` names and take one set of them (`weights`: auto, model or ema), logging which and
    why in one line that starts with `said_as` (default "<key>=<given>"). Raises ConfigError/CheckpointError (one
    line) for a missing, unreadable, foreign or newer file, or a set the file does not hold."""
    if weights not in ("auto", "model", "ema"):
        raise ConfigError(f"weights must be auto, model or ema; got {weights!r}")
    path = resolve(given, key)
    try:
        state, metadata, ckpt = read_weights(path)
    except CheckpointError as e:  # say which key named the file, and what it takes (a newer one: its own advice)
        raise CheckpointError(
            f"{key}={given}: {e}" + ("" if isinstance(e, NewerCheckpoint) else f"; give {INPUTS}")
        ) from None
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
            raise CheckpointError(
                f"{key}={given} holds only {'the ' + source if source != 'file' else 'one set of'} "
                f"weights, not the {weights}'s; use weights=auto or weights={source}"
                if source != "file"
                else f"{key}={given} is a plain weights file; weights=auto"
            )
        why = "the only set the file holds"
    incoming = Incoming(key, str(given), path, strip_wrappers(state), source, why, record, config, ckpt, metadata)
    if record is not None:
        check_record(incoming, ckpt.get("class_names") if ckpt is not None else metadata.get("class_names"))
    if (
        Path(given).expanduser().is_dir() and path.is_file()
    ):  # a run directory's best.pt: of that run, not another one's put there
        run_dir = path.parent.parent
        found = mixed_runs(run_dir, path, (record or {}).get("run_id"))
        if found is not None:
            raise CheckpointError(
                f"{key}={given}: {mixed_text(run_dir, *found)}; move {', '.join(found[0])} out of "
                f"it, or give the checkpoint you mean (a .pt file)"
            )
    log.info("%s", describe(incoming, said_as))
    return incoming


def check_record(incoming: Incoming, class_names: Any) -> None:
    """CheckpointError (one line) when a file's identity record is malformed or contradicts the file: its
    class names or architecture against the file's own class names and config, or against what its
    tensors show (their shapes, the head's class count). A file edited by hand, or by another tool."""
    record, said = incoming.identity, f"{incoming.key}={incoming.given}"
    names, arch = (
        record.get("class_names") if isinstance(record, dict) else None,
        record.get("architecture") if isinstance(record, dict) else None,
    )
    if (
        not isinstance(record, dict)
        or not isinstance(arch, (dict, type(None)))
        or not (names is None or isinstance(names, list) and all(isinstance(n, str) for n in names))
    ):
        raise CheckpointError(
            f"{said}: its identity record is malformed (architecture a mapping, class_names a list of "
            f"names); the file was edited or not written by vit-train: do not use it as it is"
        )
    found = []
    if names is not None and isinstance(class_names, list) and class_difference(class_names, names) is not None:
        found.append(
            f"its class names differ from the record's ({class_difference(names, class_names, 'in the record', 'in the file')})"
        )
    if arch and incoming.config is not None:
        found += [
            f"{key}={a} in the record, {b} in its config"
            for key, a, b in differing(arch, architecture(incoming.config["model"]))
        ]
    tensors = {k.removeprefix("encoder."): v for k, v in incoming.weights.items() if not k.startswith("decoder.")}
    if arch:
        shown = revealed(tensors)
        found += [
            f"{key}={a} in the record, {b} in its tensors"
            for key, a, b in differing(arch, shown, positions_exempt(shown, arch))
        ]
    heads = head_classes(tensors)
    if names is not None and heads is not None and heads != len(names):
        found.append(f"its head has {heads} outputs for the record's {len(names)} class names")
    if found:
        raise CheckpointError(
            f"{said} contradicts itself: {'; '.join(found)}; the file was edited or damaged: do not use it as it is"
        )


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
        return (
            f"{said_as}:{where} a state dict without a vit-train identity: its "
            f"class names, attention heads, activation (GELU or a variant) and the pooling of a model without "
            f"a class token (mean or max) cannot be checked, only its tensors' names, shapes and positions"
        )
    which = {"ema": "the EMA weights", "model": "the model's weights"}.get(incoming.source, "its weights")
    where = f" of {incoming.path}" if str(incoming.path) != incoming.given else ""
    run = f" (run {record['run_id'][:8]})" if record.get("run_id") else ""
    step = f" at step {record['step']}" if record.get("step") is not None else ""
    trained_by = options("objective").get(record.get("objective"))  # an MAE run reads no labels: no classes said
    reads = trained_by is None or trained_by.reads_labels
    classes = f"; classes {shown_classes(record['class_names'])}" if record.get("class_names") and reads else ""
    unchecked = ""
    if incoming.path.is_dir() and not record.get("run_id"):  # a Hub folder timm wrote: config.json says some of it
        arch = record.get("architecture") or {}
        unknown = [
            f"its {w}" for w, k in (("head count", "model.num_heads"), ("pooling", "model.pool")) if k not in arch
        ]
        unchecked = (
            f"; a Hub folder without a vit-train identity, checked by its config.json and tensors: "
            f"{', '.join([*unknown, 'its activation (GELU or a variant)'])} cannot be checked"
        )
    return f"{said_as}: {which}{where}{run}{step}, as {incoming.why}{classes}{unchecked}"


def load_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(state dict, metadata) from a .safetensors file, a vit-train checkpoint or a plain state dict."""
    weights, metadata, _ = read_weights(path)
    return weights, metadata


def read_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any] | None]:
    """(state dict, metadata, the whole checkpoint or None) from a .safetensors file (metadata: what
    vit-export wrote, JSON-decoded), a vit-train checkpoint (its model's weights; metadata: config and
    class names; the checkpoint itself, for its EMA and scores), a DeiT {"model": ...} or Lightning
    {"state_dict": ...} file, or a plain state dict. Raises CheckpointError (one line) for anything else."""
    path = Path(path)
    if path.is_dir():  # a Hub folder (`resolve` checked it holds both files)
        return read_hub_folder(path)
    if path.suffix == ".safetensors":
        require("safetensors", "the safetensors format", error=CheckpointError)
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                weights = {k: f.get_tensor(k) for k in f.keys()}
                metadata = f.metadata() or {}
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{path} is not a readable safetensors file ({e})") from None
        return weights, {k: _json_or_text(v) for k, v in metadata.items()}, None
    damage = archive_damage(path)
    if damage:
        raise CheckpointError(f"{path} is damaged ({damage}); get a sound copy of it")
    try:
        data = read_archive(path)
    except Exception as e:
        damage = legacy_damage(path, e)
        if damage:
            raise CheckpointError(f"{path} is damaged ({damage}); get a sound copy of it") from None
        raise CheckpointError(f"{path} cannot be read ({load_failure(e)})") from None
    for key in ("model", "state_dict"):  # vit-train and DeiT checkpoints; Lightning-style files
        if isinstance(data, dict) and isinstance(data.get(key), dict):
            vit_train = isinstance(data.get("config"), dict) and key == "model"
            if vit_train:  # read as this version writes it, or refused when a newer one wrote it
                refuse_newer(data, path)
                data = upgraded(data)
            return (
                data[key],
                {"config": data.get("config"), "class_names": data.get("class_names")},
                data if vit_train else None,
            )
    if isinstance(data, dict) and all(isinstance(v, torch.Tensor) for v in data.values()):
        return data, {}, None
    raise CheckpointError(
        f"{path} holds neither a vit-train checkpoint nor a state dict of tensors: it holds {_describe(data)}"
    )


def read_hub_folder(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], None]:
    """(state dict, metadata, None) of a Hub folder (hub.py): model.safetensors' weights; its metadata when
    vit-train exported it (config.json checked against its identity record), else metadata made of config.json:
    the identity record it gives (`hub_record`: the head count and pooling it states, its label names) and the
    class names. Raises CheckpointError (one line) for an unreadable folder or one that contradicts itself, and
    ConfigError for a network this ViT cannot compute that config.json states (hub.py `stated_architecture`)."""
    said = str(folder)
    config = read_config(folder, said)
    weights, metadata, _ = read_weights(folder / WEIGHTS)
    theirs = hub_record(config, strip_wrappers(weights), said)
    record = metadata.get("identity")
    if isinstance(record, dict):  # exported by vit-train: its record is the identity; config.json must agree
        found = hub_contradictions(config, record, theirs)
        if found:
            raise CheckpointError(
                f"{said} contradicts itself: {'; '.join(found)}; the folder was edited or mixed from two exports: "
                f"do not use it as it is"
            )
        return weights, metadata, None
    model = hub_model(theirs, config)  # what a teacher is built as (objectives/teacher.py)
    return weights, {"identity": theirs, "class_names": theirs["class_names"], "hub_model": model}, None


def exported_folder(folder: Path) -> bool:
    """Whether `folder` holds a Hub folder vit-export wrote: its model.safetensors carries vit-train's metadata."""
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError:
        return False
    try:
        with safe_open(str(folder / WEIGHTS), framework="pt") as f:
            return (f.metadata() or {}).get("format") == "vit-train"
    except (SafetensorError, OSError):
        return False


def _describe(data: Any) -> str:
    """What a loaded file holds, in a few words (a dict's first keys and their kinds)."""
    if isinstance(data, dict):
        items = ", ".join(f"{k} ({type(v).__name__})" for k, v in list(data.items())[:5])
        return f"a dict of {len(data)} entries: {items}{', ...' if len(data) > 5 else ''}"
    if isinstance(data, torch.Tensor):
        return f"one tensor of shape {tuple(data.shape)}"
    return f"a {type(data).__name__}"


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except RecursionError:  # a hostile file: nesting deep enough to exhaust the parser's stack
        raise CheckpointError(
            "safetensors metadata is nested too deeply to be read; this file was not written "
            "by a trainer, do not use it"
        ) from None
    except ValueError:  # metadata written by another tool
        return value


def export_safetensors(ckpt: dict[str, Any], path: Path, source: str = "model", spec: dict | None = None) -> None:
    """A checkpoint's weights, the model's or (`source="ema"`) the EMA's, as safetensors, with what
    using them needs as metadata: the config, the class names, the preprocessing (the checkpoint's, else
    `spec`: vit-export's from the config), the source and the identity record (run id, architecture, class
    names; which weights, their step and val score)."""
    weights = ema_weights(ckpt["ema"]) if source == "ema" else ckpt["model"]
    spec = ckpt.get("preprocess") or spec
    identity = weights_identity(ckpt, source)
    save_safetensors(
        weights,
        path,
        {
            "config": ckpt["config"],
            "class_names": ckpt["class_names"],
            "preprocess": spec,
            "weights": source,
            **({"identity": identity} if identity else {}),
        },
    )
