"""data=webdataset on shards and indexes that disagree or are malformed (issue 25's tester and newcomer inputs).

Each input forces one fault on shards tests/helpers/shards.py writes: an index that counts fewer samples than a
shard holds (the tester's #1/#2: a val tar of 6 listed as 2 was evaluated on 2; a train tar of 12 listed as 4
never read 8), a shard cut on a tar block boundary between a sample's image and its .cls (#3), a sample with a
good .png and a broken .jpg (#9), malformed indexes and .cls members (#11, #12), a brace pattern naming a local
shard that is not there, webdataset's '@ <_io.BufferedReader name=14>' in truncated-shard messages, and the
'first:' sample of the max_bad_fraction stop.
"""

from __future__ import annotations

import itertools
import json
import tarfile

import pytest
from torch.utils.data import DataLoader

from helpers.shard_streams import read_back, stream
from helpers.shards import png, write_shards
from vit_train.data.shards.index import load_index
from vit_train.data.shards.stream import StreamUnreadable
from vit_train.errors import DataError


def relist(root, split, counts):
    """index.json of `root` with the split's shard counts replaced (the shards unchanged)."""
    index = json.loads((root / "index.json").read_text())
    for shard, count in zip(index["splits"][split]["shards"], counts):
        shard["samples"] = count
    index["splits"][split]["samples"] = sum(counts)
    (root / "index.json").write_text(json.dumps(index))


def one_line(e) -> str:
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_val_shard_holding_more_samples_than_the_index_says_is_refused(tmp_path):
    write_shards(tmp_path, [6], [6])
    relist(tmp_path, "val", [2])
    with pytest.raises(DataError, match=r"^val-000000\.tar holds 6 samples but index\.json says 2; rewrite the "
                                        r"index with vit-shards") as e:
        planned(stream(tmp_path, "val"), 2, 1)  # evaluation takes the one batch the index promises, no more
    one_line(e)


def planned(s, batch, batches):
    """The first `batches` batches of a stream, as the training loop and evaluation take them (never one more)."""
    return list(itertools.islice(iter(DataLoader(s, batch_size=batch)), batches))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_train_shard_holding_more_samples_than_the_index_says_is_refused(tmp_path, workers):
    write_shards(tmp_path, [12, 4], [3])
    relist(tmp_path, "train", [4, 4])
    with pytest.raises(DataError, match=r"^train-000000\.tar holds 12 samples but index\.json says 4; rewrite"):
        planned(stream(tmp_path, workers=workers, batch=2), 2, 4 // workers)  # slot 0: its batches only


def test_shards_matching_the_index_read_to_their_end_without_refusal(tmp_path):
    write_shards(tmp_path, [4, 4], [3, 3])
    assert sorted(i for b, _ in read_back(stream(tmp_path, "val", workers=2), 2, 2) for i in b) == list(range(6))
    assert len([i for b, _ in read_back(stream(tmp_path, workers=2, batch=2), 2, 2) for i in b]) == 8


def cut_before_cls(path, keep):
    """The shard cut on a 512-byte block boundary after sample `keep`'s image, before its .cls."""
    with tarfile.open(path) as tar:
        members = tar.getmembers()
    cls = next(m for m in members if m.name.endswith(".cls") and m.name.startswith(members[2 * keep].name[:-4]))
    path.write_bytes(path.read_bytes()[:cls.offset])


def test_a_shard_cut_between_an_image_and_its_cls_is_a_truncated_shard(tmp_path):
    write_shards(tmp_path, [6, 6], [3])
    cut_before_cls(tmp_path / "train-000001.tar", 2)
    got = read_back(stream(tmp_path, buffer=1), 0, 6)
    problems = [p for _, ps in got for p in ps if p]
    assert problems and all(p.startswith("train-000001.tar#") and "train-000001.tar ends after 2 samples" in p
                            for p in problems)
    assert {int(p.split("#")[1].split(" ")[0]) for p in problems} <= {2, 3, 4, 5}
    write_shards(tmp_path, [6], [3])
    cut_before_cls(tmp_path / "val-000000.tar", 1)
    with pytest.raises(DataError, match=r"^val sample val-000000\.tar#1 \(val-000000\.tar ends after 1 samples "
                                        r"\(truncated\?\)\) cannot be read") as e:
        read_back(stream(tmp_path, "val"), 0, 2)
    one_line(e)


def test_a_cls_missing_inside_a_shard_is_still_an_error(tmp_path):
    write_shards(tmp_path, [6], [3], members=lambda split, i, key: [(f"{key}.png", png(i, split))]
                 if split == "val" and i == 1 else None)
    with pytest.raises(DataError, match=r"val_00000001 has no \.cls member"):
        read_back(stream(tmp_path, "val"), 0, 3)


def test_a_sample_with_a_broken_image_and_a_good_one_reads_the_good_one(tmp_path):
    two = lambda split, i, key: [(f"{key}.png", png(i, split)), (f"{key}.jpg", b"junk"), (f"{key}.cls", b"0")]
    write_shards(tmp_path, [6], [3], members=two)
    got = read_back(stream(tmp_path, "val"), 0, 3)
    assert [i for b, _ in got for i in b] == [0, 1, 2] and all(p == "" for _, ps in got for p in ps)
    none = lambda split, i, key: [(f"{key}.png", b"bad png"), (f"{key}.jpg", b"junk"), (f"{key}.cls", b"0")]
    write_shards(tmp_path, [6], [3], members=none)
    with pytest.raises(DataError, match=r"val_00000000\.jpg \(UnidentifiedImageError: .*\); val-000000\.tar:"
                                        r"val_00000000\.png \(UnidentifiedImageError"):
        read_back(stream(tmp_path, "val"), 0, 3)


def test_no_readable_sample_names_the_decode_error(tmp_path):
    write_shards(tmp_path, [4], [3], members=lambda split, i, key: [(f"{key}.jpg", b"junk"), (f"{key}.cls", b"0")]
                 if split == "train" else None)
    with pytest.raises(DataError, match=r"^no sample of train-000000\.tar and the shards after it can be read "
                                        r"\(first: train-000000\.tar:train_0000000\d\.jpg \(UnidentifiedImageError"):
        read_back(stream(tmp_path, batch=2), 0, 2)


def test_truncated_shard_messages_name_the_shard_not_a_stream_object(tmp_path):
    write_shards(tmp_path, [6, 6], [2])
    data = (tmp_path / "train-000001.tar").read_bytes()
    (tmp_path / "train-000001.tar").write_bytes(data[:550])  # inside the first member's data
    problems = [p for _, ps in read_back(stream(tmp_path, buffer=1), 0, 6) for p in ps if p]
    assert problems and all(p.endswith("train-000001.tar cannot be read past sample 0 (ReadError: unexpected end of "
                                       "data))") for p in problems)


def test_the_max_bad_fraction_stop_names_the_first_sample_logged():
    policy = StreamUnreadable("train", "skip", 0.1, 20)
    policy.check(["s.tar:b (x)", ""])
    with pytest.raises(DataError, match=r"first: s\.tar:b \(x\) \("):
        policy.check(["s.tar:a (y)", "s.tar:c (z)"])


@pytest.mark.parametrize("raw", [b"+2", b"0_1", b"\xd9\xa1", b"1 2", b"-1", b""])
def test_a_cls_that_is_not_ascii_decimal_digits_is_refused(tmp_path, raw):
    write_shards(tmp_path, [6], [3], members=lambda split, i, key: [(f"{key}.png", png(i, split)),
                                                                    (f"{key}.cls", raw)] if split == "val" else None)
    with pytest.raises(DataError, match=r"val_00000000\.cls holds .*, not a class index \(ASCII decimal digits\)"):
        read_back(stream(tmp_path, "val"), 0, 3)


@pytest.mark.parametrize("raw, label", [(b" 1\n", 1), (b"2\r\n", 2), (b"\t0", 0)])
def test_a_cls_with_surrounding_whitespace_is_read(tmp_path, raw, label):
    write_shards(tmp_path, [6], [3], members=lambda split, i, key: [(f"{key}.png", png(i, split)),
                                                                    (f"{key}.cls", raw)] if split == "val" else None)
    s = stream(tmp_path, "val")
    assert [int(x) for _, labels, _ in DataLoader(s, batch_size=3) for x in labels] == [label] * 3


@pytest.mark.parametrize("change, message", [
    (lambda ix: ix.update(classes=["a", "b", "a"]), r"the class name 'a' appears twice"),
    (lambda ix: ix.update(classes=["a", " ", "c"]), r"class 1 has an empty name"),
    (lambda ix: ix["splits"]["train"]["shards"][0].update(samples=True), r"needs a plain file \"name\" and a "
                                                                         r"\"samples\" count \(an integer >= 0\)"),
    (lambda ix: ix["splits"]["train"]["shards"][0].update(samples=1.5), r"\"samples\" count \(an integer >= 0\)"),
    (lambda ix: ix["splits"]["train"]["shards"][0].update(samples="5"), r"\"samples\" count \(an integer >= 0\)"),
    (lambda ix: ix["splits"]["train"]["shards"][0].update(name=7), r"needs a plain file \"name\""),
    (lambda ix: ix["splits"]["train"]["shards"][1].update(name="train-000000.tar"),
     r"the shard train-000000\.tar is listed twice"),
    (lambda ix: ix["splits"]["train"].update(samples=True), r"lists no valid train split"),
    (lambda ix: ix["splits"].pop("val"), r"index\.json has no val split \(its splits: train\); add it beside them: "
                                          r"vit-shards <the source's data=\.\.\. data\.root=\.\.\.> splits=val out="),
])
def test_a_malformed_index_is_refused_in_one_line(tmp_path, change, message):
    index = write_shards(tmp_path, [3, 3], [3])
    change(index)
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(DataError, match=message) as e:
        load_index(str(tmp_path))
    one_line(e)


def test_a_missing_local_shard_named_by_a_brace_pattern_is_refused_at_load(tmp_path):
    write_shards(tmp_path, [3, 3], [3])
    (tmp_path / "train-000001.tar").rename(tmp_path / "elsewhere.tar")
    with pytest.raises(DataError, match=r"^1 train shard\(s\) that data\.train_shards=.* names do not exist: "
                                        r".*train-000001\.tar; copy them there") as e:
        load_index(str(tmp_path), train_shards=f"{tmp_path}/train-{{000000..000001}}.tar")
    one_line(e)


def test_the_mid_epoch_refusal_says_to_raise_a_max_steps_that_ends_before_the_epoch(tmp_path):
    from helpers.shard_streams import run_config
    from vit_train.errors import ConfigError
    from vit_train.train.trainer import train

    write_shards(tmp_path / "shards", [10, 10, 10, 7], [6, 5])  # 4 steps of 8 per epoch
    train(run_config(tmp_path / "shards", trainer={"max_steps": 2}), tmp_path / "run")  # 2 workers
    step = str(tmp_path / "run" / "checkpoints" / "last.pt")
    hint = " with trainer.max_steps raised to at least 4 (it is 2), then resume"
    for cap, said in ((2, hint), (None, ", then resume")):
        with pytest.raises(ConfigError, match=r"past the epoch's end at step 4 \(it writes checkpoints/step_00000004"
                                              r"\.pt\)" + said.replace("(", r"\(").replace(")", r"\)")):
            train(run_config(tmp_path / "shards", workers=1, trainer={"max_steps": cap}, resume=step),
                  tmp_path / "run")


def test_a_pipe_command_ended_by_the_runs_own_stop_signal_is_not_blamed(tmp_path):
    import os
    import signal

    from vit_train.runtime.preemption import StopRequest

    write_shards(tmp_path, [7, 5], [3])
    pattern = "pipe:kill -TERM $$; echo {train-000000,train-000001}.tar"  # the command dies of SIGTERM
    with pytest.raises(DataError, match=r"failed \(exit status -15\); run it in a shell"):
        read_back(stream(tmp_path, train_shards=pattern), 0, 6)  # nobody stops the run: the command failed
    with StopRequest():
        os.kill(os.getpid(), signal.SIGTERM)  # as a cluster's group signal reaches the run
        with pytest.raises(DataError, match=r"^reading the shard command 'kill -TERM \$\$; echo train-00000\d\.tar' "
                                            r"ended because this run received SIGTERM and is stopping; resume the "
                                            r"run") as e:
            read_back(stream(tmp_path, train_shards=pattern), 0, 6)
    assert "failed" not in one_line(e)
