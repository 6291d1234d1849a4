"""A classifier as one ONNX file: the graph, its weights and what using it needs (class names, the
preprocessing) as the model's metadata_props; checked against PyTorch with onnxruntime when it is
installed.

The weights stay inside the .onnx file unless they are larger than torch's exporter allows in one
protobuf message (1.5 GiB, under protobuf's 2 GB limit): then they go to `<name>.onnx.data` beside
it, which onnxruntime finds by name (ViT-H/14 and larger in fp32).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from vit_train.errors import CheckpointError, UserError
from vit_train.extras import available, require
from vit_train.models.vit import VisionTransformer
from vit_train.outputs.places import fsync_dir, fsync_file, os_error_of, place_error

log = logging.getLogger("vit_train")


@contextlib.contextmanager
def _logging_off():
    """No log records at all (every logger, every level) inside the block."""
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def export_onnx(
    model: VisionTransformer, img_size: int, out: Path, verbose: bool = False, metadata: dict[str, str] | None = None
) -> dict[str, Any]:
    """Write `model` to `out`: input "images" (N, 3, img_size, img_size) float32, normalised, with a
    dynamic batch axis; output "logits" (N, classes). `metadata` (str -> str) becomes the model's
    metadata_props (onnxruntime: `session.get_modelmeta().custom_metadata_map`). A `<out>.data` file
    left by an earlier export to the same path is removed when the weights fit in `out`.

    Returns {"external_data": whether the weights went to `<out>.data`, "checked": whether onnxruntime
    compared outputs with PyTorch's on a batch of 3, "max_abs_diff" when it did}. Raises ConfigError
    (for a model without a classifier the caller asks its objective first: export.py), CheckpointError (the export failed, or the outputs differ by more than 1e-3),
    OutputError (`out` could not be written: a full disk, a read-only folder). `out` is replaced only by
    a complete, checked file: a failure leaves it as it was and no temporary file behind.
    """
    require("onnx", "ONNX export")
    require("onnxscript", "ONNX export")
    # Written into a staging folder beside `out` and checked there, then moved into place (the model
    # file last): a failed write or check leaves no .onnx looking complete. The exporter names the
    # external data file after the model file, so the staged one keeps `out`'s name.
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)  # what a killed export left
    staged = staging / out.name
    try:
        staging.mkdir()
        written = _export_checked(model, img_size, staged, verbose, metadata, out)
        _move_into_place(staged, out)
    except BaseException as e:
        shutil.rmtree(staging, ignore_errors=True)
        failed = os_error_of(e) if isinstance(e, Exception) and not isinstance(e, UserError) else None
        if failed is not None:
            raise place_error(failed, out, otherwise="give another out=") from None
        raise
    shutil.rmtree(staging, ignore_errors=True)
    return written


def _move_into_place(staged: Path, out: Path) -> None:
    """The staged model (and its external data, if any) renamed to `out`, the data file first, and
    the folder fsynced: `out` is the old export or the new complete one."""
    data_file, staged_data = out.with_name(out.name + ".data"), staged.with_name(staged.name + ".data")
    external = staged_data.exists()
    if external:
        os.replace(staged_data, data_file)
    os.replace(staged, out)
    if not external:  # an earlier export's weights, which the new file does not use
        data_file.unlink(missing_ok=True)
    fsync_dir(out.parent)


def _export_checked(
    model: VisionTransformer, img_size: int, out: Path, verbose: bool, metadata: dict[str, str] | None, final: Path
) -> dict[str, Any]:
    """export_onnx's work, written to `out` (in a fresh staging folder) and checked there; `final` is
    where it will go, for messages."""
    example = torch.randn(2, 3, img_size, img_size)
    batch = torch.export.Dim("batch", min=1)
    data_file = out.with_name(out.name + ".data")
    chatter = io.StringIO()
    with contextlib.ExitStack() as quiet:
        if not verbose:  # "[torch.onnx] Obtain model graph ... ✅" and the like
            quiet.enter_context(contextlib.redirect_stdout(chatter))
            quiet.enter_context(contextlib.redirect_stderr(chatter))
            quiet.enter_context(warnings.catch_warnings())
            quiet.enter_context(_logging_off())  # "Replaced initializer ..." comes through logging, not stderr
            warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(
                model,
                (example,),
                input_names=["images"],
                output_names=["logits"],
                dynamic_shapes={"x": {0: batch}},
                dynamo=True,
                verbose=verbose,
            )
            program.model.metadata_props.update(metadata or {})
        except Exception as e:
            detail = (chatter.getvalue().strip().splitlines() or [""])[-1]
            raise CheckpointError(
                f"the ONNX export failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                f"{'; ' + detail if detail else ''}); rerun with verbose=true to see the exporter's "
                f"messages"
            ) from None
        program.save(str(out), external_data=False)  # external data only over the exporter's size limit
        for written in (out, data_file):  # durable before they are renamed into place
            if written.exists():
                fsync_file(written)
    written = {"external_data": data_file.exists()}
    if not available("onnxruntime"):
        log.warning("onnxruntime is not installed, so the ONNX file was not checked against PyTorch")
        return {**written, "checked": False}
    import onnxruntime

    check = torch.randn(3, 3, img_size, img_size)  # another batch size than the example's
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, {"images": check.numpy()})[0])
    with torch.no_grad():
        diff = (got - model(check)).abs().max().item()
    if diff > 1e-3:
        raise CheckpointError(
            f"the ONNX model's outputs differ from PyTorch's by {diff:.2e}; it is not trustworthy, so {final} "
            f"was not written"
        )
    return {**written, "checked": True, "max_abs_diff": diff}
