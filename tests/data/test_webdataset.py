"""data=webdataset (issue 25, part A): the epoch plan, the stream read back, exact resume, refusals.

Shards are written by tests/helpers/shards.py (8x8 PNGs whose pixels name the sample), not by vit-shards.
Inputs from public reports: one shard, or fewer shards than processes x workers, hangs DDP or starves workers
(webdataset #188, #434, HF datasets #8669: SHARD_COUNTS "one-shard", and 4 workers x 3 processes on 5 shards:
every worker gets a slot of exact length); a one-shard val split with more processes than shards never
validates (webdataset #68: `test_val_reads_every_sample_once_across_processes`); steps per epoch change with
num_workers (webdataset #303: the read-back tests count batches for 0 and 2 workers); resume loses the shuffle
buffer or repeats samples (HF datasets #7901, PR #8408, webdataset #271: a resumed stream equals the rest of the
uninterrupted one); shard counts that do not divide processes x workers (timm reader_wds's "an epoch can miss or
repeat a shard's worth per worker"); empty shards in the index (SHARD_COUNTS "with-empty").
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from torch.utils.data import DataLoader

from helpers.configs import tiny_config
from helpers.shard_streams import ids_of, read_back, run_config, stream
from helpers.shards import png, write_shards
from vit_train.data.decoding import image as decode
from vit_train.data.shards.index import load_index
from vit_train.data.shards.order import (buffered_order, locate, resumed_slot, sample_seeds, shard_order,
                                         slot_batches, slot_seed, stream_starts, train_slots, val_slots)
from vit_train.data.shards.stream import ShardStream, StreamUnreadable
from vit_train.errors import ConfigError, DataError
from vit_train.train.trainer import train

SHARD_COUNTS = {"uneven": [7, 5, 9, 3, 11], "one-shard": [23], "many-small": [2, 3, 2, 3, 2, 3, 2, 3, 1],
                "with-empty": [4, 0, 9, 0, 6]}


def plan_ids(counts, seed, epoch, world, workers, batch, buffer, rank):
    """This rank's batches of sample ids (index in the split) as the plan says, from the pure functions."""
    order = shard_order(len(counts), seed, epoch)
    starts, first = stream_starts(order, counts), [sum(counts[:i]) for i in range(len(counts))]
    slots = {s.worker: s for s in train_slots(sum(counts), batch, world, workers) if s.rank == rank}
    share = batch // world
    emitted = {}
    for w, slot in slots.items():
        local = buffered_order(len(slot), buffer, slot_seed(seed, epoch, rank, w))
        emitted[w] = [first[sh] + off for sh, off in (locate(slot.start + p, order, starts) for p in local)]
    steps = sum(counts) // batch
    return [emitted[j % workers][(j // workers) * share:(j // workers + 1) * share] for j in range(steps)]


@pytest.mark.parametrize("shards", SHARD_COUNTS)
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_the_plan_gives_every_sample_once_and_every_rank_the_same_steps(shards, world, workers):
    counts, batch = SHARD_COUNTS[shards], 6
    steps = sum(counts) // batch
    per_rank = [plan_ids(counts, 3, 1, world, workers, batch, 4, r) for r in range(world)]
    assert [len(b) for b in per_rank] == [steps] * world  # no rank runs dry
    assert all(len(x) == batch // world for b in per_rank for x in b)
    ids = [i for b in per_rank for x in b for i in x]
    assert len(ids) == steps * batch and len(set(ids)) == len(ids)  # once each; the remainder < batch left out
    assert set(ids) <= set(range(sum(counts)))


def test_the_plan_is_pure_and_each_epoch_has_another_order():
    counts = SHARD_COUNTS["uneven"]
    assert plan_ids(counts, 0, 0, 2, 3, 6, 5, 1) == plan_ids(counts, 0, 0, 2, 3, 6, 5, 1)
    assert plan_ids(counts, 0, 0, 2, 3, 6, 5, 1) != plan_ids(counts, 0, 1, 2, 3, 6, 5, 1)
    assert plan_ids(counts, 0, 0, 2, 3, 6, 5, 1) != plan_ids(counts, 1, 0, 2, 3, 6, 5, 1)
    assert sorted(shard_order(20, 0, 0)) == list(range(20)) and shard_order(20, 0, 0) != shard_order(20, 0, 1)
    assert sample_seeds(5, 9) == sample_seeds(5, 9) != sample_seeds(5, 10)


@pytest.mark.parametrize("buffer", [1, 2, 7, 50])
def test_the_shuffle_buffer_emits_a_permutation_holding_at_most_buffer_samples(buffer):
    order = buffered_order(40, buffer, seed=5)
    assert sorted(order) == list(range(40))
    assert all(p <= i + buffer - 1 for i, p in enumerate(order))  # read at most buffer - 1 samples before
    assert (order == list(range(40))) == (buffer == 1)


def test_slots_and_resumed_workers_split_an_epoch_exactly():
    assert [slot_batches(10, w, 3) for w in range(3)] == [4, 3, 3]
    assert [slot_batches(2, w, 4) for w in range(4)] == [1, 1, 0, 0]  # more workers than batches: empty slots
    assert sum(len(s) for s in val_slots(11, 2, 3)) == 11
    for step in range(12):  # resumed after `step` steps: worker w' plays slot (step + w') % W, its batches then
        for w in range(3):
            slot, done = resumed_slot(step, w, 3)
            assert done == len([j for j in range(step) if j % 3 == slot])


@pytest.mark.parametrize("shards", ["uneven", "with-empty"])
@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_yields_the_planned_stream(tmp_path, workers, shards):
    counts = SHARD_COUNTS[shards]
    write_shards(tmp_path, counts, [4, 3])
    slots = max(1, workers)
    for rank in range(2):
        got = read_back(stream(tmp_path, rank=rank, world=2, workers=slots, epoch=1), workers, 3)
        assert [ids for ids, _ in got] == plan_ids(counts, 3, 1, 2, slots, 6, 4, rank)
        assert all(p == "" for _, problems in got for p in problems)


@pytest.mark.parametrize("val", [[4, 3, 5], [12]])
@pytest.mark.parametrize("workers", [0, 2])
def test_val_reads_every_sample_once_across_processes(tmp_path, workers, val):
    write_shards(tmp_path, [6], val)
    ids = [i for r in range(3) for b, _ in read_back(stream(tmp_path, "val", r, 3, max(1, workers)), workers, 2)
           for i in b]
    assert sorted(ids) == list(range(12))


def test_a_resumed_stream_is_the_rest_of_the_epoch_and_decodes_only_the_rest(tmp_path, monkeypatch):
    write_shards(tmp_path, [7, 5, 9, 3, 11], [3])
    full = read_back(stream(tmp_path, workers=2, epoch=2), 2, 6)
    for step in (1, 2, 3, 5):
        assert read_back(stream(tmp_path, workers=2, epoch=2, start=step), 2, 6) == full[step:]
    calls = []
    real = decode.decode_rgb
    monkeypatch.setattr(decode, "decode_rgb", lambda data, name: calls.append(name) or real(data, name))
    rest = read_back(stream(tmp_path, workers=2, epoch=2, start=4), 0, 6)  # in-process: calls are counted
    assert len(calls) == sum(len(ids) for ids, _ in rest) == 6


def test_pipe_urls_read_the_same_stream(tmp_path):
    write_shards(tmp_path, [7, 5, 9], [3])
    pattern = f"pipe:cat {tmp_path}/train-{{000000..000002}}.tar"
    assert read_back(stream(tmp_path, train_shards=pattern), 0, 6) == read_back(stream(tmp_path), 0, 6)
    assert read_back(stream(tmp_path, start=1, train_shards=pattern), 0, 6) == read_back(stream(tmp_path), 0, 6)[1:]


def test_a_failing_pipe_command_is_named_in_one_line(tmp_path):
    write_shards(tmp_path, [7, 5], [3])
    s = stream(tmp_path, train_shards=f"pipe:cat {tmp_path}/nothing-{{train-000000,train-000001}}.tar")
    with pytest.raises(DataError, match=r"^the shard command 'cat .*nothing-train-00000\d\.tar' failed \(exit status "
                                        r"1\); run it in a shell") as e:
        read_back(s, 0, 6)
    assert "\n" not in str(e.value)


def test_without_the_webdataset_package_the_run_says_which_extra_installs_it(tmp_path, monkeypatch):
    import vit_train.extras as extras

    monkeypatch.setattr(extras, "available", lambda module: module != "webdataset")
    with pytest.raises(ConfigError, match=r"^data=webdataset needs the webdataset package: pip install "
                                          r"'vit-train\[data\]'$"):
        load_index(str(tmp_path))


@pytest.mark.parametrize("case, args, message", [
    ("no index", {}, r"index\.json does not exist; data=webdataset reads the shards' index there"),
    ("not json", {}, r"index\.json is not a readable JSON index"),
    ("wrong format", {}, r"is not a vit-train shard index"),
    ("shard missing", {}, r"1 train shard\(s\) listed in .* are not in .*: train-000001\.tar; copy them"),
    ("wrong count", {"train_shards": "/x/train-{000000..000002}.tar"},
     r"data\.train_shards=.* expands to 3 shard\(s\), but .* lists 2 train shards"),
    ("wrong order", {"val_shards": "/x/val-{000001,000000}.tar"}, r"the URL /x/val-000001\.tar does not name "
                                                                  r"val-000000\.tar"),
    ("counts disagree", {}, r"splits\.train\.samples is 99 but its shards hold 12"),
])
def test_a_bad_index_or_shard_list_is_refused_in_one_line(tmp_path, case, args, message):
    index = write_shards(tmp_path, [6, 6], [2, 2])
    path = tmp_path / "index.json"
    if case == "no index":
        path.unlink()
    elif case == "not json":
        path.write_text("{")
    elif case == "wrong format":
        path.write_text(json.dumps({**index, "format": "something else"}))
    elif case == "shard missing":
        (tmp_path / "train-000001.tar").unlink()
    elif case == "counts disagree":
        index["splits"]["train"]["samples"] = 99
        path.write_text(json.dumps(index))
    with pytest.raises(DataError, match=message) as e:
        load_index(str(tmp_path), **args)
    assert "\n" not in str(e.value)


def corrupt(split, i, key):
    """train sample 4 holds bytes that are no image; the rest as usual."""
    if split == "train" and i == 4:
        return [(f"{key}.jpg", b"not an image"), (f"{key}.cls", b"1")]
    return None


def test_a_corrupt_member_is_replaced_by_the_slots_next_readable_sample_under_skip(tmp_path):
    write_shards(tmp_path, [6, 6], [2], members=corrupt)
    got = read_back(stream(tmp_path, buffer=1), 0, 6)  # buffer 1: the shards' order, no shuffle
    order = shard_order(2, 3, 0)
    expected = [i for sh in order for i in range(6 * sh, 6 * sh + 6)]
    at = expected.index(4)
    problems = [p for _, ps in got for p in ps]
    assert [i for ids, _ in got for i in ids] == expected[:at] + [expected[at + 1]] + expected[at + 1:]
    assert [i for i, p in enumerate(problems) if p] == [at]
    assert problems[at].startswith("train-000000.tar:train_00000004.jpg (UnidentifiedImageError: cannot identify")
    policy = StreamUnreadable("train", "skip", 0.5, 12)
    policy.check(problems)
    assert policy.replaced == 1
    with pytest.raises(DataError, match=r"^train sample train-000000\.tar:train_00000004\.jpg .* cannot be read; fix "
                                        r"or replace its shard, or set data\.bad_images=skip"):
        StreamUnreadable("train", "error", 0.5, 12).check(problems)
    with pytest.raises(DataError, match=r"1 of 12 train samples are unreadable, more than "
                                        r"data\.max_bad_fraction=0\.01"):
        StreamUnreadable("train", "skip", 0.01, 12).check(problems)


def test_a_truncated_shard_counts_its_missing_samples_as_unreadable(tmp_path):
    write_shards(tmp_path, [6, 6], [2])
    data = (tmp_path / "train-000001.tar").read_bytes()
    (tmp_path / "train-000001.tar").write_bytes(data[:len(data) // 2])  # cut inside its samples
    got = read_back(stream(tmp_path, buffer=1), 0, 6)
    ids, problems = [i for b, _ in got for i in b], [p for _, ps in got for p in ps]
    assert len(ids) == 12 and all(0 <= i < 12 for i in ids)  # batch counts stay exact
    lost = [p for p in problems if p]
    assert lost and all(p.startswith("train-000001.tar#") and "train-000001.tar cannot be read past sample" in p or
                        "ends after" in p for p in lost)
    assert set(ids) == set(range(12)) - {6 + int(p.split("#")[1].split(" ")[0]) for p in lost}
    with pytest.raises(DataError, match=r"^train sample train-000001\.tar#\d .* cannot be read; fix or replace"):
        StreamUnreadable("train", "error", 0.5, 12).check(problems)


def test_a_corrupt_val_member_stops_in_one_line(tmp_path):
    write_shards(tmp_path, [6], [3], members=lambda split, i, key: [(f"{key}.png", b"junk"), (f"{key}.cls", b"0")]
                 if split == "val" and i == 1 else None)
    with pytest.raises(DataError, match=r"^val sample val-000000\.tar:val_00000001\.png \(.*\) cannot be read; every "
                                        r"val image is evaluated"):
        read_back(stream(tmp_path, "val"), 0, 2)


@pytest.mark.parametrize("cls, message", [(None, r"val_00000000 has no \.cls member"),
                                          (b"7", r"val_00000000\.cls is 7, outside the index's 3 classes"),
                                          (b"x", r"val_00000000\.cls holds b'x', not a class index")])
def test_a_missing_or_foreign_label_stops_in_one_line(tmp_path, cls, message):
    def members(split, i, key):
        if split == "val" and i == 0:
            return [(f"{key}.png", png(0, "val"))] + ([(f"{key}.cls", cls)] if cls is not None else [])
    write_shards(tmp_path, [6], [3], members=members)
    with pytest.raises(DataError, match=message):
        read_back(stream(tmp_path, "val"), 0, 2)


def test_timm_style_samples_with_extra_members_in_any_order_are_read(tmp_path):
    def members(split, i, key):  # .cls first, then a .json, then a .jpeg-named PNG
        return [(f"{key}.cls", str(i % 3).encode()), (f"{key}.json", b"{}"), (f"{key}.jpeg", png(i, split))]
    write_shards(tmp_path, [5, 4], [3], members=members)
    got = read_back(stream(tmp_path, "val"), 0, 3)
    assert sorted(i for b, _ in got for i in b) == [0, 1, 2]


def test_a_stream_without_labels_reads_samples_that_have_no_cls(tmp_path):
    write_shards(tmp_path, [5, 4], [3], members=lambda split, i, key: [(f"{key}.webp", png(i, split))])
    index = load_index(str(tmp_path))
    s = ShardStream(index.train, 3, ids_of, True, 0, 3, 0, 1, 1, 4, labels=False)
    got = list(DataLoader(s, batch_size=3))
    assert sorted(i for images, _, _ in got for i in images.tolist()) == list(range(9))
    assert all(labels.tolist() == [0, 0, 0] for _, labels, _ in got)


# ---- whole runs: the loop, checkpoints, resume

@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    write_shards(root, [10, 10, 10, 7], [6, 5])  # 37 samples: 4 steps of 8, 5 left out per epoch
    return root


@pytest.fixture(scope="module")
def reference(shards, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference")
    train(run_config(shards), run_dir)
    return run_dir


def test_a_run_resumed_mid_epoch_with_other_workers_or_batch_is_refused_in_one_line(shards, tmp_path):
    train(run_config(shards, trainer={"max_steps": 2}), tmp_path)  # stops in the middle of epoch 1
    step = tmp_path / "checkpoints" / "last.pt"
    for change, said in (({"num_workers": 1}, r"the loader worker count \(data\.num_workers, 0 counting as 1\) is 1, "
                                               r"not 2"),
                         ({"batch_size": 4}, r"data\.batch_size is 4, not 8"),
                         ({"shuffle_buffer": 5}, r"data\.shuffle_buffer is 5, not 6")):
        with pytest.raises(ConfigError, match=r"^cannot resume in the middle of epoch 1 \(16 of its 32 images trained "
                                              rf"on\): {said}.*resume with the saved settings past the epoch's end at "
                                              r"step 4") as e:
            train(run_config(shards, data=change, resume=str(step)), tmp_path)
        assert "\n" not in str(e.value)
    state = torch.load(step, weights_only=True)
    layout = state["stream_layout"]
    assert {key: layout[key] for key in ("world_size", "loader_workers")} == {"world_size": 1, "loader_workers": 2}
    assert set(layout) == {"world_size", "loader_workers", "train_index"}  # and the index's fingerprint


def test_repeated_aug_is_refused_for_a_stream(shards, tmp_path):
    with pytest.raises(ConfigError, match=r"data\.repeated_aug=2 works with random-access data sets only"):
        train(run_config(shards, data={"repeated_aug": 2}), tmp_path)


def test_a_run_resumed_at_an_epoch_boundary_may_change_workers(shards, reference, tmp_path):
    shutil.copytree(reference, tmp_path, dirs_exist_ok=True)
    train(run_config(shards, workers=0, resume=str(tmp_path / "checkpoints" / "last.pt"),
                     trainer={"epochs": 3}), tmp_path)
    assert json.loads((tmp_path / "results.json").read_text())["steps"] == 12


@pytest.mark.parametrize("mode", ["skip", "error"])
def test_a_run_on_a_shard_with_a_corrupt_member_follows_data_bad_images(tmp_path, mode, caplog):
    write_shards(tmp_path / "shards", [10, 10, 10, 7], [6, 5], members=corrupt)
    config = run_config(tmp_path / "shards", data={"bad_images": mode, "max_bad_fraction": 0.1},
                        trainer={"epochs": 1})
    if mode == "error":  # raised in a loader worker: the message is still its one line
        with pytest.raises(DataError, match=r"^train sample train-000000\.tar:train_00000004\.jpg \(Unidentified"
                                            r"ImageError: .*\) cannot be read; fix or replace its shard, or set "
                                            r"data\.bad_images=skip to replace unreadable samples$") as e:
            train(config, tmp_path / "run")
        assert "\n" not in str(e.value)
        return
    assert train(config, tmp_path / "run")["steps"] == 4
    assert "unreadable train sample replaced: train-000000.tar:train_00000004.jpg" in caplog.text


@pytest.mark.parametrize("counts, batch, said", [([13], 4, True), ([12], 4, False), ([7, 6], 4, False)],
                         ids=["one-shard-with-a-tail", "one-shard-divisible", "two-shards"])
def test_a_one_shard_split_whose_tail_is_left_out_every_epoch_is_said_at_start(tmp_path, counts, batch, said):
    """The stream's remainder is the tail of the epoch's last shard: with one shard, the same samples every epoch,
    never trained on (silent until said); with several, another shard's tail each epoch."""
    write_shards(tmp_path / "shards", counts, [4])
    cfg = tiny_config(data={"name": "webdataset", "root": str(tmp_path / "shards"), "batch_size": batch,
                            "num_workers": 0})
    lines = [line for line in cfg.data.build(cfg, torch.device("cpu")).start_warnings if "left out every epoch" in line]
    assert lines == ([f"data=webdataset: the train split is one shard (train-000000.tar), so the 1 samples past its "
                      f"last whole batch of 4, its last 1, are left out every epoch and never trained on; write it in "
                      f"several shards (vit-shards shard_size=N: the epoch's last shard, whose tail is left out, "
                      f"changes every epoch) or use a data.batch_size that divides 13"] if said else [])
