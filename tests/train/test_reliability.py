"""Never lose a run: exact resume, checkpoint fallback and atomicity, skipped non-finite steps,
the overwrite guard, safe loading."""

import math
import signal

import pytest
import torch

from helpers.files import assert_identical, logged, read_results, rows
from vit_train.checkpoint import check_classes, load_checkpoint, save_checkpoint
from vit_train.data.datasets import TransformedDataset
from vit_train.errors import CheckpointError, RunStopped
from vit_train.runtime.preemption import StopRequest
from vit_train.train.resume import check_compatible
from vit_train.checkpoint import restore_rng
from vit_train.checkpoint import export_safetensors, load_weights
from vit_train.train.trainer import train

# Everything a resumed run must reproduce; timing fields (images_seen, train_seconds) aside.
EXACT_KEYS = ("model", "optimizer", "scheduler", "scaler", "ema", "epoch", "step", "batch_in_epoch", "best_score",
              "best_step", "skipped_steps", "rng")


def train_losses(run_dir):
    return {e["step"]: e["loss"] for e in logged(run_dir, "train")}


DEIT_AUG = {"name": "deit", "mixup_alpha": 0.8, "cutmix_alpha": 1.0, "random_erasing": 0.25, "label_smoothing": 0.1}


@pytest.mark.parametrize("workers, trainer, extra", [
    (0, {}, {}),
    (2, {}, {}),
    (0, {"ema_decay": 0.9}, {}),
    (0, {"precision": "fp16"}, {}),
    (2, {}, {"aug": DEIT_AUG, "repeated_aug": 2}),
], ids=["workers0", "workers2", "ema", "fp16", "deit-aug"])
def test_resume_at_any_step_is_bit_identical_to_an_uninterrupted_run(tmp_path, make_config, workers, trainer, extra):
    """16 steps over 2 epochs, a checkpoint kept at every step; resuming from step 5 (mid-epoch) and
    step 8 (epoch end) reproduces the weights, optimiser, EMA, scaler, RNG and every logged loss.
    deit-aug: RandAugment, erasing, MixUp/CutMix and repeated augmentation resume exactly too."""
    sections = dict(trainer={"ckpt_every": 1, "log_every": 1, "keep_last": 100, **trainer},
                    data={"num_workers": workers, "repeated_aug": extra.get("repeated_aug", 1)},
                    aug=extra.get("aug", {}), model={"drop_path": 0.2, "dropout": 0.1})  # RNG-dependent
    full = tmp_path / "full"
    train(make_config(**sections), full)
    expected = torch.load(full / "checkpoints" / "last.pt", weights_only=True)
    losses = train_losses(full)
    assert len(losses) == 16
    for stop in (5, 8):
        resumed = tmp_path / f"from_{stop}"
        snapshot = full / "checkpoints" / f"step_{stop:08d}.pt"
        train(make_config(**sections, resume=str(snapshot)), resumed)
        got = torch.load(resumed / "checkpoints" / "last.pt", weights_only=True)
        for key in EXACT_KEYS:
            assert_identical(expected[key], got[key], key)
        assert train_losses(resumed) == {s: v for s, v in losses.items() if s > stop}
    if trainer.get("ema_decay"):
        assert expected["ema"] is not None and not torch.equal(expected["ema"]["module.head.weight"],
                                                              expected["model"]["head.weight"])
        logged = rows(full)
        assert [e["step"] for e in logged if e["split"] == "val_ema"] == [8, 16]  # evaluated beside the model
    if trainer.get("precision") == "fp16":
        assert expected["scaler"]["scale"] > 0


def test_keep_last_keeps_that_many_versions(tmp_path, make_config):
    train(make_config(trainer={"ckpt_every": 2, "max_steps": 7, "keep_last": 3}), tmp_path)
    folder = tmp_path / "checkpoints"
    assert sorted(p.name for p in folder.glob("step_*.pt")) == ["step_00000004.pt", "step_00000006.pt",
                                                                "step_00000007.pt"]
    assert load_checkpoint(folder / "last.pt")["step"] == 7
    assert (folder / "last.pt").stat().st_ino == (folder / "step_00000007.pt").stat().st_ino  # a link, not a copy


def test_truncated_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, make_config, caplog):
    train(make_config(trainer={"ckpt_every": 2, "max_steps": 6, "keep_last": 2, "log_every": 1}), tmp_path)
    last = tmp_path / "checkpoints" / "last.pt"
    last.write_bytes(last.read_bytes()[:1000])  # also truncates step_6.pt: the same file
    results = train(make_config(trainer={"ckpt_every": 2, "max_steps": 8, "keep_last": 2, "log_every": 1},
                                resume="auto"), tmp_path)
    assert "last.pt is damaged (it is cut short" in caplog.text and "trying the next newest" in caplog.text
    assert "resumed from" in caplog.text and "step_00000004.pt at epoch 1, step 4" in caplog.text
    assert results["steps"] == 8
    assert sorted(train_losses(tmp_path)) == list(range(1, 9))  # steps 5-6 logged once, by the resumed run


def test_a_failed_save_leaves_the_previous_checkpoint_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint({"step": 1, "weights": torch.ones(3)}, path)
    real_save = torch.save

    def disk_full(state, f):
        real_save(state, f)  # some bytes reach the temporary file
        f.truncate(10)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(CheckpointError, match=r"no space left on .* MB free.*; the previous checkpoint there is intact"):
        save_checkpoint({"step": 2, "weights": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_a_half_written_temp_file_is_never_renamed_over_the_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint({"step": 1}, path)
    monkeypatch.setattr(torch, "save", lambda state, f: f.write(b"PK\x03\x04 half a zip"))
    with pytest.raises(CheckpointError):  # the verification load refuses it before the rename
        save_checkpoint({"step": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True)["step"] == 1 and not list(tmp_path.glob("*.tmp"))


def nan_images_for(monkeypatch, poisoned):
    """Make the images of the base indices `poisoned` (a set, or 'all') NaN."""
    real = TransformedDataset.__getitem__

    def getitem(self, key):
        image, label, unreadable = real(self, key)
        index = key[0] if isinstance(key, tuple) else key
        if poisoned == "all" or index in poisoned:
            image = torch.full_like(image, math.nan)
        return image, label, unreadable

    monkeypatch.setattr(TransformedDataset, "__getitem__", getitem)


def use_fused_adamw(monkeypatch) -> None:
    """AdamW with fused=True on the CPU: the path a CUDA run takes, where non-finite steps are
    skipped on the device by the fused kernel and counted without a host sync."""
    import vit_train.train.run as run_module

    def build(model, cfg, device, lr=None, capturable=False, family=None):
        from vit_train.train.optim import param_groups

        return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=lr, fused=True)

    monkeypatch.setattr(run_module, "build_optimizer", build)


@pytest.mark.parametrize("skip", ["host", "device"])
def test_a_nan_batch_is_skipped_and_counted(tmp_path, make_config, monkeypatch, skip):
    """host: the step checks and skips; device: the fused optimiser skips without a host sync."""
    if skip == "device":
        use_fused_adamw(monkeypatch)
    nan_images_for(monkeypatch, {7})  # one sample: one poisoned batch per epoch
    results = train(make_config(trainer={"log_every": 1}), tmp_path)
    assert results["status"] == "completed" and results["skipped_steps"] == 2 and results["steps"] == 16
    ckpt = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert all(torch.isfinite(t).all() for t in ckpt["model"].values())
    assert all(torch.isfinite(t).all() for s in ckpt["optimizer"]["state"].values() for t in s.values())
    logged = rows(tmp_path)
    train_log = [e for e in logged if e["split"] == "train"]
    assert train_log[-1]["skipped_steps"] == 2
    skipped = [e["step"] for e in train_log if e["loss"] is None]  # a window of one skipped step has no loss
    assert len(skipped) == 2 and all(e["grad_norm"] is None for e in train_log if e["step"] in skipped)
    assert all(math.isfinite(e["loss"]) for e in train_log if e["step"] not in skipped)


@pytest.mark.parametrize("skip, steps", [("host", 11), ("device", 12)])
def test_consecutive_bad_steps_stop_the_run_keeping_the_last_good_checkpoint(tmp_path, make_config, monkeypatch,
                                                                             skip, steps):
    """host: the run stops at the third bad step in a row; device: the counts are settled at the
    next log (log_every 2), so it stops there, one step later."""
    if skip == "device":
        use_fused_adamw(monkeypatch)
    train(make_config(trainer={"epochs": 1}), tmp_path)  # a good checkpoint at step 8
    before = (tmp_path / "checkpoints" / "last.pt").read_bytes()
    nan_images_for(monkeypatch, "all")
    with pytest.raises(RunStopped, match=f"{steps - 8} steps in a row had a non-finite loss") as stopped:
        train(make_config(trainer={"epochs": 2, "max_bad_steps": 3}, resume="auto"), tmp_path)
    assert stopped.value.exit_code == 3
    assert (tmp_path / "checkpoints" / "last.pt").read_bytes() == before
    results = read_results(tmp_path)
    assert results["status"] == "diverged" and results["steps"] == steps and results["skipped_steps"] == steps - 8


def test_a_second_run_in_a_directory_with_checkpoints_is_refused(tmp_path, make_config):
    train(make_config(trainer={"max_steps": 2}), tmp_path)
    before = (tmp_path / "checkpoints" / "last.pt").read_bytes()
    with pytest.raises(CheckpointError, match="already holds checkpoints; continue that run with resume=auto"):
        train(make_config(trainer={"max_steps": 2}), tmp_path)
    assert (tmp_path / "checkpoints" / "last.pt").read_bytes() == before


def test_compatibility_refuses_image_size_and_classes_and_allows_more_epochs(make_config):
    saved = make_config()
    ckpt = {"config": saved.to_dict(), "class_names": ["a", "b"]}
    with pytest.raises(CheckpointError, match=r"model.img_size: 16 -> 32"):
        check_compatible(ckpt, make_config(model={"img_size": 32}))
    with pytest.raises(CheckpointError, match="classes: 2 saved, 3 in the data now"):
        check_classes(ckpt, ["a", "b", "c"])
    assert check_compatible(ckpt, make_config(trainer={"epochs": 9})) == ["trainer.epochs: 2 -> 9"]


def test_a_failed_rng_restore_is_an_error():
    with pytest.raises(CheckpointError, match="RNG states cannot be restored"):
        restore_rng({"python": (3, (1, 2), None), "numpy": None, "torch": torch.zeros(3), "cuda": []})


def test_stop_request_sets_a_flag_and_a_second_ctrl_c_stops_at_once():
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    before = [signal.getsignal(s) for s in signals]  # SIGINT is SIG_IGN in a job started in the background (&)
    with StopRequest() as stop:
        assert not stop
        signal.raise_signal(signal.SIGUSR1)
        assert stop and stop.name == "SIGUSR1" and stop.exit_code == 138
    with StopRequest() as stop:
        signal.raise_signal(signal.SIGINT)
        assert stop.exit_code == 130
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert [signal.getsignal(s) for s in signals] == before  # handlers restored, whatever they were


def test_weights_round_trip_through_safetensors(tmp_path, make_config):
    pytest.importorskip("safetensors")
    train(make_config(trainer={"max_steps": 2}), tmp_path)
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    export_safetensors(ckpt, tmp_path / "model.safetensors")
    weights, metadata = load_weights(tmp_path / "model.safetensors")
    assert_identical(ckpt["model"], weights)
    assert metadata["class_names"] == ckpt["class_names"] and metadata["config"] == ckpt["config"]
    assert metadata["preprocess"] == ckpt["preprocess"] and metadata["weights"] == "model"
    model = make_config().model.build(10).eval()
    model.load_state_dict(weights)
    assert load_weights(tmp_path / "checkpoints" / "last.pt")[1]["class_names"] == ckpt["class_names"]


def test_load_weights_refuses_a_malicious_pickle_without_running_code(tmp_path):
    class Exploit:
        def __reduce__(self):
            return (open, (str(tmp_path / "pwned"), "w"))

    torch.save({"weight": Exploit()}, tmp_path / "evil.pth")
    with pytest.raises(CheckpointError, match="holds a pickled object"):
        load_weights(tmp_path / "evil.pth")
    assert not (tmp_path / "pwned").exists()


