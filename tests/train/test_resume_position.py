"""Resuming with changed settings keeps the data position (issue 12, kind 5).

A run resumed with another data.batch_size continues from the same image of the same epoch
permutation: every image of the interrupted epoch is trained on exactly once (a shorter last batch
finishes the epoch; the step total follows). A change that reorders the epoch in its middle
(training-set size, data.repeated_aug, seed) is refused in one line, exit status 2, the checkpoint
kept. The oracle is what the model was given: each step's images are matched to the training set,
and compared with what an uninterrupted run trains on.
"""

import shutil

import pytest
import torch

import vit_train.train.trainer as trainer_module
from helpers.files import logged, model_weights, read_results
from helpers.in_process import run_main
from helpers.runs import torchrun
from helpers.configs import aug as aug_option
from vit_train.data.sources.shapes import SHAPES_STATS
from vit_train.data.device.pipeline import DeviceTrainPipeline
from vit_train.data.sampler import EpochSampler
from vit_train.data.sources.shapes import generate_shapes
from vit_train.errors import ConfigError
from vit_train.train.trainer import train

SIZE = 128  # training images; 16x16 shapes


@pytest.fixture
def trained(monkeypatch):
    """Each step's training images, as indices into the training set, in the order the steps ran."""
    images, _ = generate_shapes(SIZE, 16, seed=0)
    mean, std = (torch.tensor(s).view(1, 3, 1, 1) for s in SHAPES_STATS)
    reference = ((images.float() / 255 - mean) / std).flatten(1)  # (SIZE, 3 * 16 * 16), as aug=none gives them
    steps: list[list[int]] = []
    original = trainer_module.train_step

    def record(run, x, y):
        distance = torch.cdist(x.detach().flatten(1).double(), reference.double())
        best = distance.min(1)
        assert best.values.max() < 1e-3, "a trained image is not one of the training set's"
        steps.append(best.indices.tolist())
        return original(run, x, y)

    monkeypatch.setattr(trainer_module, "train_step", record)
    return steps


def config(make_config, batch_size, pipeline="loader", max_steps=None, epochs=1, resume=None, data=None, seed=0,
           **trainer):
    return make_config(data={"train_size": SIZE, "val_size": 32, "batch_size": batch_size, "num_workers": 0,
                             "pipeline": pipeline, **(data or {})},
                       aug={"name": "none"}, trainer={"epochs": epochs, "max_steps": max_steps, **trainer},
                       resume=str(resume) if resume else None, seed=seed)


def flat(steps):
    return [i for step in steps for i in step]


@pytest.mark.parametrize("pipeline", ["loader", "device"])
@pytest.mark.parametrize("before, stop, after, sizes", [
    (16, 3, 32, [32, 32, 16]),  # the reported case: 48 images done, a larger batch, a short last one
    (32, 3, 16, [16, 16]),  # a smaller batch
    (16, 3, 36, [36, 36, 8]),  # a batch that does not divide the position (48)
    (20, 2, 32, [32, 32, 16]),  # the epoch ends where it began to (120 of 128), not where 32 would end it
], ids=["larger", "smaller", "not-dividing", "epoch-end-kept"])
def test_a_changed_batch_size_trains_each_image_of_the_epoch_once(tmp_path, make_config, trained, pipeline, before,
                                                                  stop, after, sizes):
    train(config(make_config, before, pipeline), tmp_path / "whole")
    epoch = flat(trained)  # the uninterrupted epoch, in order
    assert len(epoch) == SIZE // before * before and len(set(epoch)) == len(epoch)
    trained.clear()
    train(config(make_config, before, pipeline, max_steps=stop), tmp_path / "run")
    assert flat(trained) == epoch[:stop * before]
    trained.clear()
    results = train(config(make_config, after, pipeline, resume=tmp_path / "run"), tmp_path / "run")
    assert [len(s) for s in trained] == sizes
    assert flat(trained) == epoch[stop * before:]  # nothing skipped, nothing twice, in the epoch's order
    assert results["steps"] == stop + len(sizes) and results["epochs"] == 1
    assert [e["step"] for e in logged(tmp_path / "run", "val")] == [stop, stop + len(sizes)]


def test_the_next_epoch_is_whole_at_the_new_batch_size(tmp_path, make_config, trained):
    """open-instruct#681, VeOmni#853, dlrover#591: the resume offset applies to the resumed epoch only."""
    train(config(make_config, 32, epochs=2), tmp_path / "at32")
    reference = trained[4:]  # an uninterrupted batch-32 run's second epoch
    trained.clear()
    train(config(make_config, 16, max_steps=3, epochs=2), tmp_path / "run")
    trained.clear()
    results = train(config(make_config, 32, epochs=2, resume=tmp_path / "run"), tmp_path / "run")
    assert [len(s) for s in trained] == [32, 32, 16, 32, 32, 32, 32]
    assert trained[3:] == reference
    assert results["steps"] == 10 and results["epochs"] == 2


def test_stopped_at_an_epoch_end_then_resumed_at_another_batch_size(tmp_path, make_config, trained):
    """Lightning#19617, #850 and tinker-cookbook#448: a run stopped (max_steps) at an epoch's end
    starts the next epoch on resume, neither re-running nor skipping one."""
    train(config(make_config, 16, max_steps=8, epochs=2), tmp_path / "run")
    first = flat(trained)
    trained.clear()
    results = train(config(make_config, 32, epochs=2, resume=tmp_path / "run"), tmp_path / "run")
    second = flat(trained)
    assert sorted(first) == sorted(second) == list(range(SIZE)) and first != second
    assert [len(s) for s in trained] == [32] * 4 and results["steps"] == 12 and results["epochs"] == 2
    trained.clear()
    again = train(config(make_config, 16, epochs=2, resume=tmp_path / "run"), tmp_path / "run")
    assert trained == [] and again["steps"] == 12  # finished: nothing more, whatever the batch size now


def test_repeated_augmentation_resumed_at_another_batch_size_keeps_every_copy(tmp_path, make_config, trained):
    """DeiT's repeated augmentation (deit#95): each copy of the epoch's images is trained on once."""
    train(config(make_config, 16, data={"repeated_aug": 2}), tmp_path / "whole")
    epoch = flat(trained)
    trained.clear()
    train(config(make_config, 16, max_steps=3, data={"repeated_aug": 2}), tmp_path / "run")
    train(config(make_config, 24, data={"repeated_aug": 2}, resume=tmp_path / "run"), tmp_path / "run")
    assert flat(trained) == epoch
    assert sorted(epoch) == sorted(list(set(epoch)) * 2) and len(set(epoch)) == SIZE // 2


def test_a_periodic_checkpoint_in_the_middle_of_an_epoch_resumes_at_another_batch_size(tmp_path, make_config,
                                                                                        trained):
    """Lightning#19815, mini_trainer#79: a checkpoint written every step (not at a stop) holds the
    position after its step, so the resumed run neither repeats that step's images nor skips any."""
    train(config(make_config, 16, ckpt_every=1, keep_last=100), tmp_path / "whole")
    epoch = flat(trained)
    for step in (1, 7):
        trained.clear()
        snapshot = tmp_path / "whole" / "checkpoints" / f"step_{step:08d}.pt"
        train(config(make_config, 24, resume=snapshot), tmp_path / f"from_{step}")
        assert flat(trained) == epoch[16 * step:]
        assert [len(s) for s in trained] == [24] * (16 * (8 - step) // 24) + [16 * (8 - step) % 24]


def drop_position_fields(path):
    """Rewrite a checkpoint as vit-train wrote it before positions were counted in images."""
    ckpt = torch.load(path, weights_only=True)
    for key in ("sample_in_epoch", "epoch_end", "train_images"):
        del ckpt[key]
    torch.save(ckpt, path)


@pytest.mark.parametrize("after", [16, 32])
def test_an_older_checkpoint_without_the_position_in_images_resumes(tmp_path, make_config, trained, after):
    train(config(make_config, 16, max_steps=3), tmp_path / "new")
    epoch = flat(trained)
    trained.clear()
    train(config(make_config, 16, max_steps=3), tmp_path / "old")
    drop_position_fields(tmp_path / "old" / "checkpoints" / "last.pt")
    trained.clear()
    train(config(make_config, after, resume=tmp_path / "old"), tmp_path / "old")
    old_steps = [list(s) for s in trained]
    trained.clear()
    train(config(make_config, after, resume=tmp_path / "new"), tmp_path / "new")
    assert old_steps == trained and len(flat(trained)) == SIZE - 48 and not set(flat(trained)) & set(epoch)
    a, b = (torch.load(tmp_path / d / "checkpoints" / "last.pt", weights_only=True) for d in ("old", "new"))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert a["step"] == b["step"] == 3 + -(-(SIZE - 48) // after)


@pytest.mark.parametrize("change, message", [
    ({"data": {"train_size": 160}}, "the training set holds 160 images, not 128"),
    ({"data": {"repeated_aug": 2}}, "data.repeated_aug is 2, not 1"),
    ({"seed": 1}, "seed is 1, not 0"),
], ids=["train-size", "repeated-aug", "seed"])
def test_a_change_that_reorders_the_epoch_is_refused_in_its_middle_only(tmp_path, make_config, change, message):
    train(config(make_config, 16, max_steps=3), tmp_path)
    saved = {p.name: p.read_bytes() for p in [*tmp_path.glob("checkpoints/*"), tmp_path / "metrics.jsonl"]}
    with pytest.raises(ConfigError) as info:
        train(config(make_config, 16, resume=tmp_path, **change), tmp_path)
    text = str(info.value)
    assert text.startswith(f"cannot resume in the middle of epoch 1 (48 of its 128 images trained on): {message}")
    assert "past the epoch's end at step 8 (it writes checkpoints/step_00000008.pt)" in text and "\n" not in text
    assert "max_steps" not in text  # which would fit the schedule to a shorter run
    assert {p.name: p.read_bytes() for p in [*tmp_path.glob("checkpoints/*"), tmp_path / "metrics.jsonl"]} == saved
    # as the message says: the saved settings past the epoch's end, then the change from that epoch's checkpoint
    reference = train(config(make_config, 16, epochs=2), tmp_path / "reference")  # for the schedule
    train(config(make_config, 16, epochs=2, resume=tmp_path), tmp_path)
    at_end = tmp_path / "checkpoints" / "step_00000008.pt"
    assert torch.load(at_end, weights_only=True)["scheduler"] == \
        torch.load(tmp_path / "reference" / "checkpoints" / "step_00000008.pt", weights_only=True)["scheduler"]
    assert train(config(make_config, 16, epochs=2, resume=at_end, **change), tmp_path)["epochs"] == 2


@pytest.mark.parametrize("edit, count", [("add", 49), ("remove", 47)])
def test_an_image_folder_that_changed_in_the_middle_of_an_epoch_is_refused(tmp_path, make_config, image_folder, edit,
                                                                           count):
    """Images added to (or deleted from) the training folder between the stop and the resume."""
    def cfg(**trainer):
        return make_config(data={"name": "imagefolder", "root": str(image_folder), "batch_size": 8,
                                 "num_workers": 0}, model={"img_size": 16}, trainer={"epochs": 1, **trainer},
                           resume=str(tmp_path / "run") if "max_steps" not in trainer else None)

    train(cfg(max_steps=2), tmp_path / "run")
    picture = image_folder / "train" / "red" / "0.png"
    if edit == "add":
        shutil.copy(picture, picture.with_name("new.png"))
    else:
        picture.unlink()
    with pytest.raises(ConfigError, match=rf"\(16 of its 48 images trained on\): the training set holds {count} "
                                          r"images, not 48, which reorders the epoch"):
        train(cfg(), tmp_path / "run")


def test_the_refusal_is_one_line_and_exit_status_2_from_the_command_line(tmp_path, make_config, monkeypatch, capsys):
    """vit-train's entry point in this process (tests/helpers/in_process.py), from tmp_path."""
    from vit_train.cli.train import train_main

    run = tmp_path / "run"
    train(config(make_config, 16, max_steps=3), run)
    before = (run / "checkpoints" / "last.pt").read_bytes()
    monkeypatch.chdir(tmp_path)
    status, _, err = run_main(train_main, monkeypatch, capsys, f"resume={run}", "data.batch_size=32",
                              "data.repeated_aug=2", "trainer.max_steps=null", prog="vit-train")
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith("model.pretrained=<the checkpoint>"), err
    assert "data.repeated_aug is 2, not 1" in lines[0] and "Traceback" not in err
    assert (run / "checkpoints" / "last.pt").read_bytes() == before
    assert read_results(run)["steps"] == 3


def test_processes_share_a_resumed_epoch_with_a_short_last_batch():
    order = [i for i, _ in EpochSampler(SIZE, seed=4)]
    shares = []
    for rank in range(2):
        sampler = EpochSampler(SIZE, seed=4, batch_size=32, rank=rank, world_size=2)
        sampler.set_epoch(0, start=48, end=SIZE)
        shares.append([i for i, _ in sampler])
    assert [len(s) for s in shares] == [40, 40]  # 16 + 16 + 8 each
    rebuilt = [i for lo, hi in ((0, 16), (16, 32), (32, 40)) for s in shares for i in s[lo:hi]]
    assert rebuilt == order[48:]
    assert sampler.batches_left() == sampler.steps_left(48, SIZE, 1) == 3 and sampler.left_out == 0
    assert sampler.steps_left(48, SIZE, 3) == 3 + 2 * 4


@pytest.mark.slow  # ~7 s on 2 cores; torchrun
def test_two_processes_resume_a_one_process_run_at_another_batch_size_like_one_process(tmp_path, make_config):
    """torchrun, 2 processes on gloo: the short last batch (16) is shared 8 + 8; the losses and weights
    are those of one process resuming the same checkpoint at the same batch size."""
    train(config(make_config, 16, max_steps=3), tmp_path / "one")
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    train(config(make_config, 32, resume=tmp_path / "one"), tmp_path / "one")
    done = torchrun(f"resume={tmp_path / 'two'}", "data.batch_size=32", "trainer.max_steps=null", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    one, two = ({e["step"]: e["loss"] for e in logged(tmp_path / d, "train")} for d in ("one", "two"))
    assert set(one) == set(two) and max(one) == 6
    assert all(abs(one[s] - two[s]) < 1e-5 * one[s] for s in one)
    a, b = (model_weights(tmp_path / d) for d in ("one", "two"))
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize("start, end, new_end, kept, left_out", [
    (48, 128, 128, 126, 2),  # a last batch of 8 over 3 processes: 2 each, 2 images cannot be shared
    (120, 122, 120, 120, 2),  # 2 images left for 3 processes: the epoch ends where it stands
])
def test_a_last_batch_that_processes_cannot_share_says_how_many_images_it_leaves_out(start, end, new_end, kept,
                                                                                     left_out):
    order = [i for i, _ in EpochSampler(SIZE, seed=4)]
    shares = []
    for rank in range(3):
        sampler = EpochSampler(SIZE, seed=4, batch_size=24, rank=rank, world_size=3)
        sampler.set_epoch(0, start=start, end=end)
        shares.append([i for i, _ in sampler])
    assert (sampler.end, sampler.left_out) == (new_end, left_out)
    assert [len(s) for s in shares] == [(kept - start) // 3] * 3
    assert sorted(i for s in shares for i in s) == sorted(order[start:kept])


@pytest.mark.parametrize("world_size", [1, 2])
def test_the_on_device_pipeline_gives_the_short_last_batch_to_each_process(world_size):
    images = torch.arange(SIZE, dtype=torch.uint8).view(SIZE, 1, 1, 1).expand(SIZE, 3, 8, 8).contiguous()
    got = []
    for rank in range(world_size):
        sampler = EpochSampler(SIZE, seed=4, batch_size=32, rank=rank, world_size=world_size)
        sampler.set_epoch(0, start=48, end=SIZE)
        pipeline = DeviceTrainPipeline(images, torch.arange(SIZE), sampler, aug_option("basic"), 8,
                                       ((0.0,) * 3, (1.0,) * 3), torch.device("cpu"))
        batches = list(pipeline)
        assert [len(y) for _, y in batches] == [32 // world_size, 32 // world_size, 16 // world_size]
        assert len(pipeline) == 3 and [x.shape[0] for x, _ in batches] == [len(y) for _, y in batches]
        got.append([y.tolist() for _, y in batches])
    order = [i for i, _ in EpochSampler(SIZE, seed=4)]
    assert [i for b in range(3) for r in range(world_size) for i in got[r][b]] == order[48:]


def test_a_short_last_batch_split_unevenly_by_accumulation_weighs_each_image_alike(tmp_path, make_config):
    """A last batch of 14 in 4 micro-batches (4, 4, 4, 2) gives the full batch's gradient."""
    for name, accum in (("split", 4), ("whole", 1)):
        train(config(make_config, 10, max_steps=1, epochs=2), tmp_path / name)
        train(config(make_config, 32, epochs=2, resume=tmp_path / name, accum_steps=accum), tmp_path / name)
    a, b = (torch.load(tmp_path / d / "checkpoints" / "last.pt", weights_only=True) for d in ("split", "whole"))
    assert a["step"] == b["step"] == 1 + 4 + 4  # 10 done, then 32, 32, 32 and 14 of the 120; then 4 x 32
    for name in a["model"]:
        torch.testing.assert_close(a["model"][name], b["model"][name], rtol=1e-4, atol=1e-5)
