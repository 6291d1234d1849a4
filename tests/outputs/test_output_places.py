"""Every command on a bad output place (issue 23, part D): a full disk, a read-only or missing folder,
an output path that is a folder or a FIFO. Each ends in one line, exit 2, no traceback; nothing is
half written (the earlier file stays, byte for byte, or there is none) and no temporary file is left.

The faults are forced at an exact point (a write, an fsync, a rename raising ENOSPC; a FIFO where the
file goes); test_output_places_tmpfs.py repeats the commands on a real full or read-only tmpfs.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import sys
from pathlib import Path

import pytest

from helpers.configs import tiny_config
from helpers.files import file_bytes
from helpers.in_process import run_main
from helpers.runs import command
from vit_train.cli import commands
from vit_train.errors import OutputError
from vit_train.outputs import places

FULL = OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from vit_train.train.trainer import train

    run_dir = tmp_path_factory.mktemp("run")
    train(tiny_config(trainer={"max_steps": 2}), run_dir)
    return run_dir / "checkpoints" / "last.pt"


def one_line_error(done, prog: str) -> str:
    """The command's error line; asserts exit 2, no traceback and nothing else on stderr but held log lines."""
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith(f"{prog}: error: ")]
    assert len(errors) == 1, done.stderr
    return errors[0]


# --- write_atomic: the file fsynced before its rename, the folder after; a failure changes nothing -----

def test_write_atomic_fsyncs_the_file_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(a), str(b))), real_replace(a, b))[1])
    target = tmp_path / "results.json"
    places.write_atomic(target, '{"a": 1}\n')
    tmp = str(tmp_path / "results.json.tmp")
    assert events == [("fsync", tmp), ("replace", tmp, str(target)), ("fsync", str(tmp_path))]
    assert target.read_text() == '{"a": 1}\n'


def test_results_json_goes_through_the_fsyncing_writer(tmp_path, monkeypatch):
    from vit_train.outputs import metrics

    synced = []
    monkeypatch.setattr(places, "fsync_dir", lambda folder: synced.append(Path(folder)))
    metrics.write_results(tmp_path, {"status": "completed"})
    assert synced == [tmp_path] and json.loads((tmp_path / "results.json").read_text()) == {"status": "completed"}


@pytest.mark.parametrize("fails", ["write", "fsync", "replace"])
def test_write_atomic_that_fails_at_any_call_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch, fails):
    target = tmp_path / "summary.md"
    target.write_text("the earlier summary\n")

    class Failing(io.FileIO):
        def write(self, data):
            super().write(bytes(data)[: len(data) // 2])  # half of it reaches the disk, then the disk is full
            raise FULL

    if fails == "write":
        monkeypatch.setattr(places, "open", lambda path, mode: io.BufferedWriter(Failing(path, "w")), raising=False)
    elif fails == "fsync":
        monkeypatch.setattr(places, "fsync_file", lambda path: (_ for _ in ()).throw(FULL))
    else:
        monkeypatch.setattr(places.os, "replace", lambda a, b: (_ for _ in ()).throw(FULL))
    with pytest.raises(OSError):
        places.write_atomic(target, "x" * 100_000)
    assert [p.name for p in tmp_path.iterdir()] == ["summary.md"]
    assert target.read_text() == "the earlier summary\n"


# --- the output place checked before the work -------------------------------------------------------

def test_an_output_file_that_is_a_fifo_a_folder_or_under_a_file_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "m.safetensors")
    (tmp_path / "folder.onnx").mkdir()
    (tmp_path / "file").write_text("x")
    cases = {"m.safetensors": "is a FIFO (named pipe), not a file to write", "folder.onnx": "is a folder, not a file",
             "file/m.onnx": "file is a file, not a folder; give another out="}
    for name, says in cases.items():
        with pytest.raises(OutputError, match=re.escape(says)):
            places.check_output_file(tmp_path / name, "out")
    assert (tmp_path / "m.safetensors").is_fifo() and (tmp_path / "file").read_text() == "x"


def test_a_missing_output_folder_is_checked_without_being_made(tmp_path):
    """A command that fails later for another reason (its data, its checkpoint) leaves no empty folder."""
    places.check_output_folder(tmp_path / "a" / "b" / "eval", "out")
    places.check_output_file(tmp_path / "c" / "m.onnx", "out")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # the real command (12 s); check_output_file's own test above is fast
def test_vit_export_to_a_fifo_is_one_line_and_never_blocks(checkpoint, tmp_path):
    fifo = tmp_path / "m.safetensors"
    os.mkfifo(fifo)
    done = command("export", f"ckpt={checkpoint}", f"out={fifo}")  # helpers.runs: a 300 s timeout, never reached
    assert "is a FIFO (named pipe), not a file to write" in one_line_error(done, "vit-export")
    assert fifo.is_fifo()


# --- vit-export: a failed write leaves the earlier export as it was -----------------------------------

def test_a_safetensors_export_that_runs_out_of_space_keeps_the_earlier_export(checkpoint, tmp_path, monkeypatch,
                                                                             capsys):
    out = tmp_path / "m.safetensors"
    out.write_bytes(b"the earlier export")
    import safetensors.torch

    def half_then_full(tensors, path, metadata=None):
        Path(path).write_bytes(b"half")  # as safetensors leaves it: its error names the OS error in text
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", half_then_full)
    code, _, err = run_main(commands.export_main, monkeypatch, capsys, f"ckpt={checkpoint}", f"out={out}",
                            prog="vit-export")
    assert code == 2 and "Traceback" not in err
    assert f"vit-export: error: could not write {out}: no space left on " in err
    assert file_bytes(tmp_path) == {Path("m.safetensors"): b"the earlier export"}


@pytest.mark.parametrize("fails", ["save", "check"])
def test_an_onnx_export_that_fails_leaves_no_onnx_file_and_no_staging(checkpoint, tmp_path, monkeypatch, capsys, fails):
    """The model is written into a staging folder and checked there; a full disk in the save, or outputs
    that differ from PyTorch's, leave the earlier export (and its .data) as they were."""
    pytest.importorskip("onnxruntime")
    import onnx_ir
    import onnxruntime

    out = tmp_path / "m.onnx"
    out.write_bytes(b"the earlier export")
    (tmp_path / "m.onnx.data").write_bytes(b"its weights")
    if fails == "save":
        def full(model, path, *args, **kwargs):
            Path(path).write_bytes(b"half a model")
            raise FULL
        monkeypatch.setattr(onnx_ir, "save", full)
    else:
        real = onnxruntime.InferenceSession.run
        monkeypatch.setattr(onnxruntime.InferenceSession, "run", lambda self, *a, **k: [real(self, *a, **k)[0] + 1])
    code, _, err = run_main(commands.export_main, monkeypatch, capsys, f"ckpt={checkpoint}", f"out={out}",
                            prog="vit-export")
    assert code == 2 and "Traceback" not in err
    says = f"could not write {out}: no space left on" if fails == "save" else f"so {out} was not written"
    assert says in err, err
    assert file_bytes(tmp_path) == {Path("m.onnx"): b"the earlier export", Path("m.onnx.data"): b"its weights"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]


# --- vit-eval: every file staged; the earlier evaluation replaced only once all are written --------

def test_an_evaluation_that_runs_out_of_space_keeps_the_earlier_one_whole(checkpoint, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from vit_train.tools import report

    out = tmp_path / "eval"
    first = report.evaluate_checkpoint(checkpoint, attention_images=2, out_dir=out, progress=False)
    before = file_bytes(out)
    assert len(first["figures"]) >= 2 and Path("metrics.json") in before
    saved = []
    real = report.save_figure

    def second_fails(fig, path):
        saved.append(path.name)
        if len(saved) == 2:
            Path(path).write_bytes(b"half a PNG")
            raise FULL
        return real(fig, path)

    monkeypatch.setattr(report, "save_figure", second_fails)
    with pytest.raises(OutputError, match=r"could not write .*\.png: no space left on .*\(out=\)"):
        report.evaluate_checkpoint(checkpoint, attention_images=2, out_dir=out, progress=False)
    assert file_bytes(out) == before  # byte for byte, and no temporary file


def test_a_metrics_json_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    from vit_train.errors import ConfigError
    from vit_train.tools.report import previous_files

    os.mkfifo(tmp_path / "metrics.json")
    with pytest.raises(ConfigError, match="metrics.json is not a regular file"):
        previous_files(tmp_path)


@pytest.mark.slow  # the real command (9 s)
def test_vit_eval_into_a_place_under_a_file_is_one_line_before_the_evaluation(checkpoint, tmp_path):
    (tmp_path / "file").write_text("x")
    done = command("eval", f"ckpt={checkpoint}", f"out={tmp_path / 'file' / 'eval'}", "progress=false")
    assert f"{tmp_path / 'file'} is a file, not a folder; give another out=" in one_line_error(done, "vit-eval")
    assert file_bytes(tmp_path) == {Path("file"): b"x"}


# --- standard output: a full disk is one line, and a file it went to is cut back ------------------------

def test_output_to_a_file_that_fills_up_is_cut_back_to_its_size_before(tmp_path, monkeypatch):
    path = tmp_path / "predictions.txt"
    path.write_text("an earlier line\n")

    class FullAfter(io.FileIO):
        def write(self, data):
            written = super().write(bytes(data)[:7])  # a few bytes fit, then the disk is full
            if written:
                raise FULL
            return written

    stream = io.TextIOWrapper(io.BufferedWriter(FullAfter(path, "a")), write_through=False)
    monkeypatch.setattr(sys, "stdout", stream)
    monkeypatch.setattr(places, "_drop_stdout", lambda: None)  # the test's own descriptor stays open
    with pytest.raises(OutputError, match=f"could not write {path}: no space left on"):
        places.print_output("a.png: circle 0.910\nb.png: square 0.870")
    assert path.read_text() == "an earlier line\n"  # no shorter list of predictions that looks complete


@pytest.mark.parametrize("name, args", [("predict", ["images=[{image}]"]),
                                        pytest.param("export", ["out={tmp}/m.safetensors"], marks=pytest.mark.slow)])
def test_a_command_whose_stdout_is_dev_full_says_so_in_one_line(checkpoint, tmp_path, name, args):
    from PIL import Image

    image = tmp_path / "a.png"
    Image.new("RGB", (16, 16), "red").save(image)
    args = [a.format(image=image, tmp=tmp_path) for a in args]
    code = (f"import sys; sys.stdout = open('/dev/full', 'w'); from vit_train.cli.commands import {name}_main as m; "
            f"sys.argv[0] = 'x'; m()")
    import subprocess

    done = subprocess.run([sys.executable, "-c", code, f"ckpt={checkpoint}", *args], capture_output=True, text=True,
                          timeout=300)
    assert "could not write the output to /dev/full: No space left on device" in one_line_error(done, f"vit-{name}")


# --- vit-sweep-summary ----------------------------------------------------------------------------------

def fake_sweep(root: Path) -> Path:
    """A sweep directory of two finished jobs (their .hydra records and results.json), no training."""
    for job, lr in enumerate(["0.001", "0.0005"]):
        (root / str(job) / ".hydra").mkdir(parents=True)
        (root / str(job) / ".hydra" / "overrides.yaml").write_text(f"- optim.lr={lr}\n")
        (root / str(job) / "results.json").write_text(json.dumps({"status": "completed", "best_top1": 10.0 + job}))
    return root


@pytest.mark.parametrize("fails", ["summary.csv", "summary.md"])
def test_a_sweep_summary_that_runs_out_of_space_is_one_line_and_leaves_no_half_file(tmp_path, monkeypatch, capsys,
                                                                                 fails):
    from vit_train.sweeps import summary

    sweep = fake_sweep(tmp_path / "sweep")
    (sweep / "summary.csv").write_text("the earlier csv\n")
    (sweep / "summary.md").write_text("the earlier table\n")
    real = places.write_atomic

    def full_at(path, text):
        if Path(path).name == fails:
            raise FULL
        real(path, text)

    monkeypatch.setattr(summary, "write_atomic", full_at)
    with pytest.raises(SystemExit) as exited:
        summary.main([str(sweep)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"vit-sweep-summary: error: could not write {sweep / fails}: no space left on ")
    left = {p.name for p in sweep.iterdir()}
    assert left == {"0", "1", "summary.csv", "summary.md"}  # no temporary file
    assert (sweep / fails).read_text() == f"the earlier {'csv' if fails == 'summary.csv' else 'table'}\n"


def test_vit_sweep_summary_on_a_file_says_it_is_not_a_folder(tmp_path, monkeypatch, capsys):
    from subprocess import CompletedProcess

    from vit_train.sweeps.summary import main

    (tmp_path / "sweep").write_text("x")
    status, out, err = run_main(main, monkeypatch, capsys, str(tmp_path / "sweep"), prog="vit-sweep-summary")
    done = CompletedProcess(["vit-sweep-summary"], status, out, err)  # as one_line_error reads a command's
    assert one_line_error(done, "vit-sweep-summary").endswith(f"sweep directory {tmp_path / 'sweep'} is not a folder")


@pytest.mark.parametrize("code, says", [(errno.ENOSPC, "no space left on "),
                                        (errno.EROFS, "the file system there is read-only; make it writable, then "
                                                      "continue with resume=auto"),
                                        (errno.EACCES, "permission denied; make it writable")])
def test_a_runs_own_file_that_cannot_be_written_says_why_and_what_to_do(tmp_path, code, says):
    """metrics.jsonl, tb/ or results.json on a disk that filled or was remounted read-only mid-run."""
    from vit_train.outputs.metrics import writing

    with pytest.raises(OutputError, match=re.escape(f"could not write {tmp_path / 'metrics.jsonl'}: {says}")):
        with writing(tmp_path / "metrics.jsonl"):
            raise OSError(code, os.strerror(code))


def test_output_into_a_closed_pipe_ends_quietly_with_sigpipes_status(monkeypatch):
    """`vit-predict ... | head -1` (openvax/mhctools#387, trailofbits/graphtage#156: a traceback, or an
    argument error with exit 2): the reader has what it wanted; status 141 as SIGPIPE gives, nothing said."""
    read, write = os.pipe()
    os.close(read)
    stream = io.TextIOWrapper(io.FileIO(write, "w"))
    monkeypatch.setattr(sys, "stdout", stream)
    monkeypatch.setattr(places, "_drop_stdout", lambda: None)
    with pytest.raises(SystemExit) as exited:
        places.print_output("a.png: circle 0.910")
    assert exited.value.code == 141
    try:
        stream.close()
    except OSError:  # what the buffer still holds cannot go anywhere
        pass


def test_a_sweep_whose_summary_does_not_fit_at_its_end_is_one_line_and_keeps_the_jobs(tmp_path, monkeypatch, capsys):
    from omegaconf import OmegaConf

    from vit_train.cli.train import SweepSummary
    from vit_train.sweeps import summary

    sweep = fake_sweep(tmp_path / "sweep")
    before = file_bytes(sweep)
    monkeypatch.setattr(summary, "write_atomic", lambda path, text: (_ for _ in ()).throw(FULL))
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}},
                               "sweep": {"objective": "best_top1", "direction": "maximize"}})
    with pytest.raises(SystemExit) as exited:
        SweepSummary().on_multirun_end(config)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"vit-train: error: could not write {sweep / 'summary.csv'}: no space left on ")
    assert file_bytes(sweep) == before


@pytest.mark.parametrize("make", ["file", "fifo"])
def test_a_run_directory_in_the_way_of_a_file_or_fifo_is_refused_before_hydra(tmp_path, make):
    from vit_train.cli.train import check_writable
    from vit_train.errors import ConfigError

    blocker = tmp_path / "x"
    blocker.write_text("x") if make == "file" else os.mkfifo(blocker)
    for given in (blocker, blocker / "run"):
        with pytest.raises(ConfigError, match=re.escape(f"cannot create the run directory {given}: {blocker} is not a "
                                                        f"folder; give another one with hydra.run.dir=")):
            check_writable([f"hydra.run.dir={given}"])
    assert [p.name for p in tmp_path.iterdir()] == ["x"]
