"""vit-eval, vit-predict, vit-export and vit-shards: key=value arguments in the style of vit-train's overrides.

    vit-eval ckpt=PATH [data=cifar10] [data.root=...] [model.img_size=N] [weights=auto|model|ema]
             [attention.images=8] [out=DIR] [--json]
    vit-predict ckpt=PATH images=[a.jpg,FOLDER,'PATTERN'] [top_k=5] [weights=auto|model|ema] [--json]
    vit-export ckpt=PATH format=safetensors|onnx|hf [out=PATH] [weights=auto|model|ema] [verbose=true]
    vit-shards data=NAME [data.root=DIR] out=DIR [shard_size=1000] [maxsize=BYTES] [splits=train,val]
               [image_format=source|png|jpg|webp] [short_side=N] [overwrite=true] [workers=N] [--json]

Bad input ends with one line on stderr and exit status 2, as for vit-train.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import logging.handlers
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from vit_train.errors import ConfigError, UserError, exit_with
from vit_train.schema.config import config_dir, known_keys, run_dir_of
from vit_train.schema.typed import option_class, unknown_key_message
from vit_train.schema.typed import options as registered

CONFIG_SECTIONS = ("data", "trainer")  # what vit-eval may change in a checkpoint's config
CONFIG_KEYS = ("model.img_size",)  # and these keys: another resolution, positions interpolated


def parse_args(argv: list[str], options: dict[str, Any], config: bool = False) -> tuple[dict, dict]:
    """(options, config overrides) from key=value arguments.

    `options` maps each option to its default (... = required). With `config`, `data=NAME` picks a
    data group file and `data.KEY=VALUE` / `trainer.KEY=VALUE` override single keys.
    """
    from vit_train.cli.arguments import (
        parse_override,  # values are read as vit-train reads its overrides (Hydra's grammar)
    )

    values, overrides = dict(options), {}
    valid = known_keys()
    # group choices first: a section that data=NAME replaces keeps the data.KEY=VALUE given before it too
    argv = sorted(argv, key=lambda arg: arg.partition("=")[0] not in CONFIG_SECTIONS)
    for arg in argv:
        if "=" not in arg:
            raise ConfigError(
                f"'{arg}' is not key=value (options: {', '.join(options)}); a value with spaces "
                f"needs quotes, e.g. \"ckpt='/path/my run/last.pt'\""
            )
        key, value = parse_override(arg)
        if key in options:
            values[key] = value
        elif config and key in CONFIG_SECTIONS:
            overrides[key] = group_file(key, str(value))
            if key == "data":  # how the images are read (batch size, workers): the checkpoint's unless given
                loading = {
                    k for cls in option_class(key, str(value)).__mro__ for k in cls.__dict__.get("loading_keys", ())
                }
                overrides[key] = {k: v for k, v in overrides[key].items() if k not in loading}
        elif config and (key.split(".")[0] in CONFIG_SECTIONS or key in CONFIG_KEYS):
            if key not in valid:
                raise ConfigError(unknown_key_message(key, valid))
            section, leaf = key.split(".", 1)
            overrides.setdefault(section, {})[leaf] = value
        else:
            extra = ", or data=NAME / data.KEY=VALUE / trainer.KEY=VALUE / model.img_size=N" if config else ""
            raise ConfigError(f"unknown option '{key}' (options: {', '.join(options)}{extra})")
    missing = [k for k, v in values.items() if v is ...]
    if missing:
        raise ConfigError(f"missing {', '.join(f'{k}=...' for k in missing)}")
    return values, overrides


def group_file(group: str, name: str) -> dict:
    """The whole `group` section as option `name` makes it: its class's defaults, then what the option's
    YAML file sets (as vit-train composes it)."""
    path = Path(config_dir()) / group / f"{name}.yaml"
    if not path.is_file() and name not in registered(group):
        choices = sorted({*(p.stem for p in path.parent.glob("*.yaml")), *registered(group)})
        raise ConfigError(f"no {group} option '{name}' (choices: {', '.join(choices)})")
    # YAML as Hydra reads it (5e-4 is a number); another package's option: its class's defaults
    plain = (OmegaConf.to_container(OmegaConf.load(path)) or {}) if path.is_file() else {}
    plain.pop("defaults", None)
    return {**dataclasses.asdict(option_class(group, name)()), **plain}


def run(prog: str, work: Callable[[list[str]], tuple[Any, Callable[[Any], str]]]) -> None:
    """Run a command's work, which returns (results, a function rendering them as text): prints the
    text, or with --json the results as JSON. Bad input becomes one line on stderr and exit status 2:
    the work's log lines (which weights, which size) are held back until it succeeds."""
    held = logging.handlers.MemoryHandler(capacity=10_000, flushLevel=logging.CRITICAL + 1)
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(logging.Formatter("%(message)s"))
    held.setTarget(stderr)
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[held], force=True)
    logging.getLogger("vit_train").setLevel(logging.INFO)
    argv = sys.argv[1:]
    if {"-h", "--help"} & set(argv):
        print(help_text(prog))
        return
    try:
        results, render = work([a for a in argv if a != "--json"])
    except UserError as e:
        held.buffer.clear()
        exit_with(prog, e)
    held.flush()
    held.capacity = 0  # from here on, lines go out as they come
    from vit_train.outputs.places import print_output

    try:  # stdout on a full disk or /dev/full: one line, and a file it went to cut back to its size before
        print_output(json.dumps(results, indent=2) if "--json" in argv else render(results))
    except UserError as e:
        exit_with(prog, e)


# What each command does, in its usual form: the first lines of its --help, before its usage from the docstring above.
SUMMARIES = {
    "vit-eval": "vit-eval ckpt=PATH [key=value ...]: evaluate a checkpoint on its data set's validation split (top-1/5,\n"
    "per class, confusion matrix, attention maps); metrics.json and figures go to the run's eval/.",
    "vit-predict": "vit-predict ckpt=PATH images=[FILE,FOLDER,'PATTERN'] [key=value ...]: classify images with a\n"
    "checkpoint: each image's top_k classes with their probabilities.",
    "vit-export": "vit-export ckpt=PATH [format=safetensors|onnx|hf] [key=value ...]: write a checkpoint's weights as\n"
    "a safetensors or ONNX file, or a Hub folder timm loads (format=hf), by default into the run's export/.",
    "vit-shards": "vit-shards data=NAME [data.root=DIR] out=DIR [key=value ...]: write a data set's train and val\n"
    "splits as WebDataset tar shards with an index.json, for vit-train data=webdataset data.root=DIR.",
}


def help_text(prog: str) -> str:
    """`prog --help`: what it does in its usual form (SUMMARIES), its usage from this module's docstring, the
    data options where it takes data=NAME, and how bad input ends."""
    usage = __doc__.split("\n\n")[1].splitlines()
    start = next(i for i, line in enumerate(usage) if line.startswith(f"    {prog} "))
    end = next((i for i in range(start + 1, len(usage)) if usage[i].startswith("    vit-")), len(usage))
    lines = [SUMMARIES[prog], "", "usage: " + usage[start][4:], *("   " + line for line in usage[start + 1 : end])]
    if prog == "vit-eval":
        choices = sorted(path.stem for path in (Path(config_dir()) / "data").glob("*.yaml"))
        lines.append(
            f"data=NAME evaluates on another data set ({', '.join(choices)});\n"
            f"data.KEY=VALUE, trainer.KEY=VALUE and model.img_size=N change one key of the checkpoint's config"
        )
    elif prog == "vit-shards":
        lines.append(
            "data=NAME: a data set vit-train reads (vit-train --help lists them); data.KEY=VALUE sets one of\n"
            "its keys (vit-train data=NAME --cfg job shows them)"
        )
    return "\n".join([*lines, __doc__.split("\n\n")[2].strip()])


def _eval(argv: list[str]) -> tuple[dict, Callable[[dict], str]]:
    opts, overrides = parse_args(
        argv, {"ckpt": ..., "weights": "auto", "attention.images": 8, "out": None, "progress": True}, config=True
    )
    from vit_train.tools.report import (
        evaluate_checkpoint,  # torch is imported only once the arguments are known to be valid
    )

    def unwritten(results: dict) -> None:  # its files could not be written: the numbers still reach stdout
        from vit_train.outputs.places import print_output

        try:
            print_output(json.dumps(results, indent=2) if "--json" in sys.argv[1:] else eval_text(results))
        except UserError:  # standard output on the same full disk: the write's own error is the line to give
            pass

    return evaluate_checkpoint(
        str(opts["ckpt"]),
        overrides,
        opts["weights"],
        int(opts["attention.images"]),
        opts["out"],
        bool(opts["progress"]),
        unwritten,
    ), eval_text


def eval_text(results: dict) -> str:
    """vit-eval's text: what was evaluated (checkpoint, step, weights, data, image size, overrides), the
    numbers as the checkpoint's objective reports them (tools/report.py `evaluation_text`) and the files written."""
    weights = {"ema": "EMA weights", "model": "model weights"}[results["weights"]]
    size = results.get("img_size")
    changed = results.get("overrides") or {}
    what = (
        f"{results['checkpoint']} (step {results['step']}, {weights}) on {results['data']} val"
        + (f" at {size}x{size}" if size else "")
        + (f" ({', '.join(f'{k}={v}' for k, v in changed.items())})" if changed else "")
    )
    written = (
        f"\n\nwritten to {results['out_dir']}: metrics.json" + "".join(f", {Path(f).name}" for f in results["figures"])
        if "out_dir" in results
        else "\n\nnot written: metrics.json and the figures could not be (the line below says why)"
    )
    from vit_train.tools.report import evaluation_text  # torch: only once the arguments are known to be valid

    return evaluation_text(results, what) + written


def _predict(argv: list[str]) -> tuple[list, Callable[[list], str]]:
    opts, _ = parse_args(argv, {"ckpt": ..., "images": ..., "top_k": 5, "weights": "auto"})
    from vit_train.tools.inference import load_for_inference
    from vit_train.tools.predict import predict

    files = opts["images"] if isinstance(opts["images"], list) else [opts["images"]]
    trained = load_for_inference(str(opts["ckpt"]), opts["weights"])
    results = predict(trained, [str(f) for f in files], int(opts["top_k"]))
    return results, lambda results: "\n".join(
        r["file"] + ": " + ", ".join(f"{t['class']} {t['probability']:.3f}" for t in r["top"]) for r in results
    )


def _export(argv: list[str]) -> tuple[dict, Callable[[dict], str]]:
    opts, _ = parse_args(argv, {"ckpt": ..., "format": None, "out": None, "weights": "auto", "verbose": False})
    if opts["format"] is None:  # not given: the out= file's extension says it, else safetensors
        suffix = Path(str(opts["out"])).suffix.lstrip(".") if opts["out"] else ""
        opts["format"] = suffix if suffix in ("safetensors", "onnx") else "safetensors"
    if opts["format"] not in ("safetensors", "onnx", "hf"):
        raise ConfigError(f"format must be safetensors, onnx or hf; got {opts['format']!r}")
    from vit_train.checkpoint import checkpoint_file
    from vit_train.outputs.places import check_output_file
    from vit_train.tools.export import export
    from vit_train.tools.inference import load_for_inference

    ckpt_path = checkpoint_file(str(opts["ckpt"]))
    fmt = str(opts["format"])
    if fmt == "hf":  # a folder: config.json, model.safetensors, README.md
        from vit_train.tools.hub_export import check_out, export_hf

        folder = (
            Path(opts["out"]).expanduser()
            if opts["out"]
            else run_dir_of(str(ckpt_path)) / "export" / f"{ckpt_path.stem}-hf"
        )
        check_out(folder)  # before the checkpoint is read
        return export_hf(load_for_inference(ckpt_path, opts["weights"]), folder), export_text
    out = (
        Path(opts["out"]).expanduser()
        if opts["out"]
        else run_dir_of(str(ckpt_path)) / "export" / f"{ckpt_path.stem}.{fmt}"
    )
    if out.is_dir():
        raise ConfigError(f"out={out} is a folder; give a file name, e.g. out={out / f'model.{fmt}'}")
    if out.suffix != f".{fmt}":
        raise ConfigError(
            f"out={out} does not end in .{fmt}, the format written (format={fmt}); name it "
            f"{out.with_suffix('.' + fmt).name}, or give format={out.suffix.lstrip('.') or '...'}"
        )
    check_output_file(out, "out")  # a FIFO, a read-only or missing place: said before the checkpoint is read
    return export(load_for_inference(ckpt_path, opts["weights"]), fmt, out, bool(opts["verbose"])), export_text


def export_text(result: dict) -> str:
    checked = ""
    if result["format"] == "onnx":
        checked = (
            "; one file with the class names and preprocessing in its metadata"
            if not result["external_data"]
            else f", its weights in {result['path']}.data (over 1.5 GiB, too large for one file): copy both"
        )
        checked += (
            f"; outputs match PyTorch's (max abs diff {result['max_abs_diff']:.1e})"
            if result["checked"]
            else "; not checked (pip install onnxruntime)"
        )
    if result["format"] == "hf":
        checked = f"; timm's {result['architecture']} layout: {', '.join(result['files'])}"
    return f"wrote {result['path']} ({result['format']}, {result['weights']} weights){checked}"


def _shards(argv: list[str]) -> tuple[dict, Callable[[dict], str]]:
    # splits=train,val is one value here, not Hydra's sweep over two
    argv = [f"splits=[{a[7:]}]" if a.startswith("splits=") and "," in a and a[7:8] not in "[\"'" else a for a in argv]
    opts, overrides = parse_args(
        argv,
        {
            "out": ...,
            "shard_size": 1000,
            "maxsize": None,
            "splits": ["train", "val"],
            "image_format": "source",
            "overwrite": False,
            "progress": True,
            "workers": None,
            "short_side": None,
        },
        config=True,
    )
    from vit_train.tools.shards import write_shards

    splits = opts["splits"] if isinstance(opts["splits"], list) else str(opts["splits"]).split(",")
    if not isinstance(opts["shard_size"], int) or not (
        opts["maxsize"] is None or isinstance(opts["maxsize"], (int, float))
    ):
        raise ConfigError(
            f"shard_size (samples) and maxsize (bytes) are numbers; got shard_size={opts['shard_size']}, "
            f"maxsize={opts['maxsize']}"
        )
    if not (opts["workers"] is None or isinstance(opts["workers"], int) and opts["workers"] >= 0):
        raise ConfigError(f"workers is a number of processes (0: none besides this one); got {opts['workers']}")
    from vit_train.config import Config

    cfg = Config.from_dict(overrides)
    index = write_shards(
        cfg,
        str(opts["out"]),
        [str(s) for s in splits],
        opts["shard_size"],
        None if opts["maxsize"] is None else int(opts["maxsize"]),
        str(opts["image_format"]),
        bool(opts["overwrite"]),
        bool(opts["progress"]),
        min(8, os.cpu_count() or 1) if opts["workers"] is None else int(opts["workers"]),
        opts["short_side"],
    )
    return {"out": str(Path(str(opts["out"])).expanduser()), "written": [str(s) for s in splits], **index}, shards_text


def shards_text(index: dict) -> str:
    parts = [
        f"{s['samples']} {name} samples in {len(s['shards'])} shard{'' if len(s['shards']) == 1 else 's'}"
        for name, s in index["splits"].items()
        if name in index.get("written", index["splits"])
    ]
    kept = [name for name in index["splits"] if name not in index.get("written", index["splits"])]
    added = f" beside its {', '.join(kept)} split" if kept else ""
    sides = {index["splits"][name].get("short_side") for name in index.get("written", index["splits"])}
    resized = f", shorter sides at most {sides.pop()} px" if len(sides) == 1 and None not in sides else ""
    return (
        f"wrote {' and '.join(parts)} ({len(index['classes'])} classes{resized}) to {index['out']}{added}, "
        f"index.json last"
    )


def eval_main() -> None:
    run("vit-eval", _eval)


def predict_main() -> None:
    run("vit-predict", _predict)


def export_main() -> None:
    run("vit-export", _export)


def shards_main() -> None:
    run("vit-shards", _shards)
