"""vit-eval's files: one evaluation per folder (eval/ for the run's own val set at its trained size,
eval/<what changed>/ for another), an earlier evaluation's files removed before the new ones are
written, metrics.json saying what was evaluated; top-5 shown only when it can be below 100%."""

import json
import sys

import pytest

from helpers.configs import tiny_config
from helpers.in_process import run_main
from vit_train.cli.commands import eval_main, eval_text, export_main
from vit_train.data.sources.shapes import Shapes
from vit_train.objectives.classify import Classify
from vit_train.tools.report import eval_dir, evaluate_checkpoint
from vit_train.train.trainer import train

pytest.importorskip("matplotlib")


def vit_eval(monkeypatch, capsys, *args) -> str:
    """vit-eval ARGS in this process (a subprocess costs seconds of imports); its stdout."""
    status, out, err = run_main(eval_main, monkeypatch, capsys, *args, prog="vit-eval")
    assert status == 0, err
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 2-step micro ViT on shapes (16x16, patch 4, learned positions), its own run directory."""
    run = tmp_path_factory.mktemp("run")
    train(tiny_config(trainer={"max_steps": 2}), run)
    return run


def test_an_override_gets_its_own_folder_and_the_first_evaluation_stays(run_dir):
    last = run_dir / "checkpoints" / "last.pt"
    plain = evaluate_checkpoint(last, weights="model", attention_images=1, progress=False)
    assert plain["out_dir"] == str(run_dir / "eval")
    before = (run_dir / "eval" / "metrics.json").read_bytes()
    saved = json.loads(before)
    assert {k: saved[k] for k in ("checkpoint", "step", "weights", "img_size", "trained_img_size", "overrides")} == {
        "checkpoint": str(last), "step": 2, "weights": "model", "img_size": 16, "trained_img_size": 16, "overrides": {}}
    assert saved["data"] == "shapes" and saved["data_root"] is None

    bigger = evaluate_checkpoint(last, {"model": {"img_size": 24}}, weights="model", attention_images=1,
                                 progress=False)
    folder = run_dir / "eval" / "model.img_size=24"
    assert bigger["out_dir"] == str(folder)
    saved = json.loads((folder / "metrics.json").read_text())
    assert (saved["img_size"], saved["trained_img_size"], saved["overrides"]) == (24, 16, {"model.img_size": 24})
    assert sorted(p.name for p in folder.iterdir()) == sorted(["metrics.json", *(p.split("/")[-1] for p in saved["figures"])])
    assert (run_dir / "eval" / "metrics.json").read_bytes() == before  # the first evaluation is untouched


def test_an_evaluation_replaces_the_earlier_ones_files_and_nothing_else(run_dir, tmp_path):
    last = run_dir / "checkpoints" / "last.pt"
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    first = evaluate_checkpoint(last, attention_images=2, out_dir=out, progress=False)
    assert len(first["figures"]) >= 4 and all((out / f.split("/")[-1]).is_file() for f in first["figures"])
    evaluate_checkpoint(last, attention_images=0, out_dir=out, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "notes.txt"]  # no PNG of the first one
    assert json.loads((out / "metrics.json").read_text())["figures"] == []


def test_the_folder_is_named_by_what_changes_the_evaluation(tmp_path):
    ckpt = tmp_path / "run" / "checkpoints" / "best.pt"
    base = tmp_path / "run" / "eval"
    same = Shapes().all_loading_keys()  # the data set's keys that say how its images are read, not which
    assert eval_dir(ckpt, {}) == base
    assert eval_dir(tmp_path / "run" / "export" / "best.safetensors", {}) == base  # what vit-export wrote
    # how the images are loaded, the device, the progress bar: the same evaluation
    assert eval_dir(ckpt, {"data.batch_size": 7, "data.num_workers": 2, "trainer.device": "cpu",
                           "trainer.progress": False}, same) == base
    assert eval_dir(ckpt, {"data.batch_size": 7}) == base / "data.batch_size=7"  # without them it names the folder
    assert eval_dir(ckpt, {"model.img_size": 48, "data.batch_size": 7}, same) == base / "model.img_size=48"
    assert eval_dir(ckpt, {"trainer.precision": "bf16"}) == base / "trainer.precision=bf16"
    one = eval_dir(ckpt, {"data.name": "imagefolder", "data.root": "/data/a/my set"})
    other = eval_dir(ckpt, {"data.name": "imagefolder", "data.root": "/data/b/my set"})
    assert one.parent == base and one.name.startswith("data.name=imagefolder,data.root=my_set-")
    assert len(one.name.rsplit("-", 1)[1]) == 8 and one != other  # the same last part, two roots: two folders
    long = eval_dir(ckpt, {f"data.k{i}": "v" * 20 for i in range(8)})
    assert long.parent == base and len(long.name) == 100 + 9


def test_vit_eval_says_what_it_evaluated_and_where_it_wrote(run_dir, monkeypatch, capsys):
    shown = vit_eval(monkeypatch, capsys, f"ckpt={run_dir / 'checkpoints' / 'last.pt'}", "model.img_size=20",
                     "attention.images=0", "progress=false")
    assert shown.splitlines()[0].endswith("on shapes val at 20x20 (model.img_size=20), 128 images")
    assert "top-5 " in shown  # shapes: 10 classes
    assert shown.rstrip().endswith(f"written to {run_dir / 'eval' / 'model.img_size=20'}: metrics.json")


@pytest.mark.parametrize("classes, shown", [(3, False), (5, False), (6, True), (10, True), (None, True)])
def test_top5_is_shown_only_with_more_than_5_classes(classes, shown):
    metrics = {"loss": 0.5, "top1": 90.0, "top5": 100.0}
    line = Classify().eval_text(metrics, None, classes)
    assert ("top-5" in line) == shown
    assert line.startswith("val loss 0.5000, top-1 90.00%")
    results = {"checkpoint": "x.pt", "step": 1, "weights": "model", "objective": "classify", "data": "imagefolder",
               "img_size": 16,
               "images": 9, **metrics, "per_class": {f"c{i}": 90.0 for i in range(classes or 10)},
               "confusion": [[1] * (classes or 10)] * (classes or 10), "figures": [], "out_dir": "eval"}
    text = eval_text(results)
    assert ("top-5" in text) == shown and "top-1 90.00%" in text


def test_vit_eval_on_three_classes_keeps_the_top5_key_and_does_not_print_it(image_folder, tmp_path, monkeypatch,
                                                                           capsys):
    cfg = tiny_config(model={"img_size": 16, "patch_size": 4}, aug={"name": "none"},
                      data={"name": "imagefolder", "root": str(image_folder), "batch_size": 4}, trainer={"max_steps": 1})
    train(cfg, tmp_path / "run")
    shown = vit_eval(monkeypatch, capsys, f"ckpt={tmp_path / 'run'}", "attention.images=0", "progress=false")
    assert "top-5" not in shown and "top-1 " in shown
    saved = json.loads((tmp_path / "run" / "eval" / "metrics.json").read_text())
    assert saved["top5"] == 100.0 and len(saved["per_class"]) == 3


@pytest.mark.parametrize("classes, shown", [(("a", "b", "c"), False), (tuple("abcdef"), True)])
def test_the_training_log_shows_top5_only_when_it_can_be_below_100(tmp_path, caplog, classes, shown):
    from helpers.images import write_image_folder

    root = write_image_folder(tmp_path / "data", {"train": 2, "val": 1}, classes=classes, size=(16, 16))
    cfg = tiny_config(data={"name": "imagefolder", "root": str(root), "batch_size": 4}, trainer={"max_steps": 1})
    with caplog.at_level("INFO", logger="vit_train"):
        train(cfg, tmp_path / "run")
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("step 1 "))
    assert ("top-5 " in line) == shown and "top-1 " in line, line


def test_an_out_folder_holding_another_tools_metrics_json_is_refused_and_left_alone(tmp_path):
    """out=<a folder of another tool> deleted the files its metrics.json listed (an adversarial trial)."""
    from helpers.files import file_bytes
    from vit_train.errors import ConfigError
    from vit_train.tools.report import clear_previous

    (tmp_path / "metrics.json").write_text('{"figures": ["report.pdf"], "acc": 0.9}')
    (tmp_path / "report.pdf").write_text("x")
    before = file_bytes(tmp_path)
    with pytest.raises(ConfigError, match="holds a metrics.json that vit-eval did not write"):
        clear_previous(tmp_path)
    assert file_bytes(tmp_path) == before


@pytest.mark.parametrize("out, says", [  # in this process (tests/helpers/in_process.py): all three are fast
    ("folder", "is a folder; give a file name"),
    ("m.safetensors", "does not end in .onnx, the format written"),
    ("m.pt", "does not end in .onnx, the format written")])
def test_vit_export_refuses_an_out_that_is_a_folder_or_names_another_format(tmp_path, out, says, monkeypatch, capsys):
    (tmp_path / "folder").mkdir()
    status, _, err = run_main(export_main, monkeypatch, capsys, f"ckpt={tmp_path / 'none.pt'}", "format=onnx",
                              f"out={tmp_path / out}", prog="vit-export")
    assert status == 2 and err.count("\n") == 1, err
    assert says in err, err  # said before the checkpoint is read


def test_the_per_class_table_lines_up_with_wide_class_names():
    """Chinese class names take two terminal columns each: the rows sat two columns off the header."""
    from vit_train.objectives.classify import columns

    results = {"weights": "model", "checkpoint": "c.pt", "step": 1, "objective": "classify", "data": "imagefolder",
               "out_dir": "e",
               "figures": [], "images": 4, "top1": 50.0, "top5": 100.0, "loss": 0.7,
               "per_class": {"猫": 100.0, "dog": 0.0}, "confusion": [[2, 0], [2, 0]]}
    header, *rows = eval_text(results).splitlines()[3:6]
    at = columns(header[:header.index("top-1")]) + len("top-1")  # the terminal column where "top-1" ends
    assert [columns(r[:r.index("%")]) for r in rows] == [at, at], [header, *rows]  # "100.0", "  0.0" end there
    assert columns("猫") == 2 and columns("é") == 1 and columns("e\u0301") == 1


@pytest.mark.parametrize("out, fmt", [  # in this process (tests/helpers/in_process.py): all three are fast
    ("m.onnx", "onnx"), ("m.safetensors", "safetensors"), ("m.bin", None)])
def test_vit_export_takes_the_format_from_outs_extension_when_format_is_not_given(tmp_path, out, fmt, monkeypatch,
                                                                                  capsys):
    status, _, err = run_main(export_main, monkeypatch, capsys, f"ckpt={tmp_path / 'none.pt'}", f"out={tmp_path / out}",
                              prog="vit-export")
    assert status == 2 and err.count("\n") == 1, err
    if fmt:  # the format fits: the next check, the missing checkpoint, speaks
        assert "does not exist" in err, err
    else:  # the default format, safetensors, does not fit .bin
        assert "does not end in .safetensors, the format written (format=safetensors)" in err, err


@pytest.mark.parametrize("json_flag", [False, True])
def test_a_full_disk_under_out_still_prints_the_numbers_and_leaves_no_empty_folder(run_dir, tmp_path, monkeypatch,
                                                                                     capsys, json_flag):
    import errno

    import vit_train.tools.report as report

    def full(path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(report, "fsync_file", full)
    out = tmp_path / "new" / "eval"
    monkeypatch.setattr(sys, "argv", ["vit-eval", f"ckpt={run_dir}", f"out={out}", "attention.images=2",
                                      "progress=false", *(["--json"] if json_flag else [])])
    with pytest.raises(SystemExit) as ended:
        eval_main()
    assert ended.value.code == 2
    printed, said = capsys.readouterr()
    assert len(said.strip().splitlines()) == 1 and "out=" in said and "Traceback" not in said, said
    assert not (tmp_path / "new").exists()  # the folders made for out= are removed again
    monkeypatch.undo()
    written = evaluate_checkpoint(run_dir, attention_images=0, out_dir=tmp_path / "written", progress=False)
    if json_flag:
        shown = json.loads(printed)
        assert shown["figures"] == [] and "out_dir" not in shown
        assert {k: v for k, v in shown.items() if k != "figures"} == {
            k: v for k, v in written.items() if k not in ("figures", "out_dir")}
    else:
        assert printed.splitlines()[1].startswith(f"top-1 {written['top1']:.2f}%") and printed.rstrip().endswith(
            "not written: metrics.json and the figures could not be (the line below says why)")


def test_a_kill_at_every_call_of_the_replacement_leaves_one_whole_evaluation(tmp_path):
    """vit-eval unlinked the earlier evaluation's files, then renamed the new ones in: a kill -9 between
    (strace inject at the first rename) left only *.tmp files, metrics.json and every figure gone. Killed
    (tests/helpers/fs_killer.py, a forked child) before each file-system call of a replacement whose figures
    partly share names with the earlier ones: metrics.json is there, every figure it lists is there, each
    file is the old one or the complete new one, and with the new metrics.json every figure is new; a later
    vit-eval leaves exactly its own files (no temporary file, no earlier figure)."""
    import os
    import shutil
    import signal
    from pathlib import Path

    import matplotlib.pyplot as plt

    from helpers.fs_killer import arm
    from vit_train.tools.report import write_evaluation

    def file_bytes(folder: Path) -> dict[str, bytes]:  # metrics.json with its figures' names, not paths
        found = {p.name: p.read_bytes() for p in folder.iterdir()}
        if "metrics.json" in found:
            saved = json.loads(found["metrics.json"])
            found["metrics.json"] = json.dumps({**saved, "figures": [Path(f).name for f in saved["figures"]]}).encode()
        return found

    def figures(names, color):
        made = {}
        for name in names:
            made[name] = plt.figure(figsize=(1, 1))
            made[name].patch.set_facecolor(color)
        return made

    old_figs, new_figs = figures("abc", "red"), figures("abd", "blue")  # a, b replaced; c removed; d new
    old_results, new_results = {"checkpoint": "old.pt", "step": 1}, {"checkpoint": "new.pt", "step": 2}
    base, fresh = tmp_path / "base", tmp_path / "fresh"
    write_evaluation(base, old_results, old_figs)
    write_evaluation(fresh, new_results, new_figs)
    old, new = file_bytes(base), file_bytes(fresh)
    assert sorted(old) == ["a.png", "b.png", "c.png", "metrics.json"] and old["a.png"] != new["a.png"]

    def killed_replacing(out: Path, n: int, calls: list | None = None) -> bool:
        shutil.copytree(base, out)
        pid = os.fork()
        if pid == 0:
            seen: list = []
            arm(out, n, seen, everything=True)
            write_evaluation(out, new_results, new_figs)
            if calls is not None:
                (out.parent / "calls.json").write_text(json.dumps(seen))
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL

    assert not killed_replacing(tmp_path / "listed", 0, [])
    calls = json.loads((tmp_path / "calls.json").read_text())
    assert file_bytes(tmp_path / "listed") == new
    kinds = [call[0] for call in calls]
    assert kinds.count("os.rename") == 4 and "os.remove" in kinds, calls  # c.png removed after the renames
    for n in range(1, len(calls) + 1):
        out = tmp_path / f"kill_{n}"
        assert killed_replacing(out, n), n
        left = {name: data for name, data in file_bytes(out).items()  # not the temporaries (checked below)
                if not name.startswith(".") and not name.endswith(".tmp")}
        saved = json.loads(left["metrics.json"])
        which = old if left["metrics.json"] == old["metrics.json"] else new
        assert left["metrics.json"] == which["metrics.json"], (n, calls[n - 1])
        for figure in saved["figures"]:
            name = Path(figure).name
            assert name in left, (n, calls[n - 1], sorted(left))
            assert left[name] == which[name] or which is old and left[name] == new.get(name), (n, calls[n - 1], name)
        for name, data in left.items():  # every file the old one or the complete new one
            assert data in (old.get(name), new.get(name)), (n, calls[n - 1], name)
        write_evaluation(out, new_results, new_figs)  # a later vit-eval cleans what the killed one left
        assert file_bytes(out) == new, (n, calls[n - 1])
    plt.close("all")
