import hashlib
import http.server
import os
import pickle
import shutil
import tarfile
import threading
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from helpers.images import write_cifar10, write_image, write_image_folder
from helpers.configs import build_data
from vit_train.data.sources import cifar
from vit_train.data.sources.imagefolder_files import load_image_folders
from vit_train.data.datasets import TensorImages, TransformedDataset
from vit_train.data.sampler import EpochSampler
from vit_train.data.sources.shapes import CLASS_NAMES, generate_shapes
from vit_train.errors import DataError


# --- shapes ---------------------------------------------------------------------------------------

def test_shapes_are_deterministic_per_seed_and_balanced():
    a, labels = generate_shapes(200, 24, seed=3)
    b, labels_b = generate_shapes(200, 24, seed=3)
    c, _ = generate_shapes(200, 24, seed=4)
    assert torch.equal(a, b) and torch.equal(labels, labels_b)
    assert not torch.equal(a, c)
    assert a.shape == (200, 3, 24, 24) and a.dtype == torch.uint8
    assert labels.bincount(minlength=10).tolist() == [20] * 10


def test_shapes_class_is_the_shape_not_the_colour():
    images, labels = generate_shapes(400, 32, seed=0)
    mean_colour = images.float().mean(dim=(2, 3))  # (N, 3)
    per_class = torch.stack([mean_colour[labels == c].mean(0) for c in range(len(CLASS_NAMES))])
    # class-mean colours are close to each other; the shapes' areas differ only a little
    assert (per_class.max(0).values - per_class.min(0).values).max() < 40


# --- CIFAR ----------------------------------------------------------------------------------------

def test_cifar_reads_python_batches_into_uint8_tensors(tmp_path):
    written = write_cifar10(tmp_path)
    (train_x, train_y), (test_x, test_y), names = cifar.load_cifar("cifar10", tmp_path, download=False)
    assert names == [f"class{i}" for i in range(10)]
    assert train_x.shape == (20, 3, 32, 32) and train_x.dtype == torch.uint8
    expected = np.concatenate([written[f"data_batch_{i}"][0] for i in range(1, 6)]).reshape(-1, 3, 32, 32)
    assert torch.equal(train_x, torch.from_numpy(expected))
    assert train_y.tolist() == sum((written[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    assert torch.equal(test_x, torch.from_numpy(written["test_batch"][0].reshape(-1, 3, 32, 32)))


def test_cifar100_layout(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for name, n in (("train", 6), ("test", 2)):
        with open(folder / name, "wb") as f:
            pickle.dump({"data": np.zeros((n, 3072), np.uint8), "fine_labels": list(range(n)),
                         "coarse_labels": [0] * n}, f)
    with open(folder / "meta", "wb") as f:
        pickle.dump({"fine_label_names": [f"c{i}" for i in range(100)], "coarse_label_names": []}, f)
    (train_x, train_y), (test_x, _), names = cifar.load_cifar("cifar100", tmp_path, download=False)
    assert len(names) == 100 and train_x.shape == (6, 3, 32, 32) and train_y.tolist() == list(range(6))


def test_cifar_with_missing_batches_names_them(tmp_path):
    write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    (tmp_path / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(DataError, match="missing data_batch_3, test_batch"):
        cifar.load_cifar("cifar10", tmp_path, download=True)


def test_cifar_absent_without_download_says_where_it_looked(tmp_path):
    with pytest.raises(DataError, match="no CIFAR-10 batches under"):
        cifar.load_cifar("cifar10", tmp_path, download=False)


def test_cifar_batch_that_would_run_code_is_refused(tmp_path):
    write_cifar10(tmp_path)

    class Exploit:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "pwned",))

    with open(tmp_path / "cifar-10-batches-py" / "data_batch_1", "wb") as f:
        pickle.dump({"data": Exploit(), "labels": []}, f)
    with pytest.raises(DataError, match="not a readable CIFAR batch"):
        cifar.load_cifar("cifar10", tmp_path, download=False)
    assert not (tmp_path / "pwned").exists()


@pytest.fixture
def served_archive(tmp_path, monkeypatch):
    """A CIFAR-10 archive served over HTTP on localhost, registered as the download source."""
    source = tmp_path / "source"
    write_cifar10(source)
    serve = tmp_path / "serve"
    serve.mkdir()
    archive = serve / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(serve))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/cifar-10-python.tar.gz"
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()

    def register(checksum: str = md5):
        fmt = cifar.FORMATS["cifar10"]
        monkeypatch.setitem(cifar.FORMATS, "cifar10", type(fmt)(**{**fmt.__dict__, "url": url, "md5": checksum}))

    yield register
    server.shutdown()


def test_cifar_downloads_verifies_and_reads(served_archive, tmp_path):
    served_archive()
    root = tmp_path / "downloaded"
    (train_x, _), (test_x, _), names = cifar.load_cifar("cifar10", root, download=True)
    assert train_x.shape == (20, 3, 32, 32) and len(names) == 10
    assert (root / "cifar-10-batches-py" / "data_batch_5").is_file()


def test_cifar_download_with_a_bad_checksum_is_refused_and_deleted(served_archive, tmp_path):
    served_archive("0" * 32)
    root = tmp_path / "downloaded"
    with pytest.raises(DataError, match="failed its MD5 check"):
        cifar.load_cifar("cifar10", root, download=True)
    assert not (root / "cifar-10-python.tar.gz").exists()
    assert not (root / "cifar-10-batches-py").exists()


@pytest.mark.parametrize("placed", ["truncated", "another file", "whole", "a folder", "a FIFO"])
def test_a_cifar_archive_put_there_by_hand_is_unpacked_when_whole_and_otherwise_named_never_deleted(
        served_archive, tmp_path, placed):
    """An archive the user put under data.root (no network on a compute node) is theirs: whole (its MD5 the
    official one), it is unpacked without a download; otherwise the line names the file and why, and the file
    stays as it was (it was deleted, with "could not download" as the only word)."""
    served_archive()
    fmt = cifar.FORMATS["cifar10"]
    root = tmp_path / "root"
    root.mkdir()
    archive = root / "cifar-10-python.tar.gz"
    served = tmp_path / "serve" / "cifar-10-python.tar.gz"
    if placed == "truncated":
        archive.write_bytes(served.read_bytes()[:-100])
    elif placed == "another file":
        archive.write_bytes(b"<html>a login page</html>")
    elif placed == "whole":
        archive.write_bytes(served.read_bytes())
        served.unlink()  # nothing to download: the placed archive is all there is
    elif placed == "a folder":
        archive.mkdir()
    else:
        os.mkfifo(archive)
    before = archive.read_bytes() if archive.is_file() else None
    if placed == "whole":
        (train_x, _), _, names = cifar.load_cifar("cifar10", root, download=True)
        assert train_x.shape == (20, 3, 32, 32) and len(names) == 10
    else:
        why = {"truncated": "is not the CIFAR-10 archive", "another file": "is not the CIFAR-10 archive",
               "a folder": "is a folder, not the CIFAR-10 archive", "a FIFO": "is a FIFO, not the CIFAR-10 archive"}
        with pytest.raises(DataError) as refused:
            cifar.load_cifar("cifar10", root, download=True)
        assert str(refused.value).startswith(f"{archive} {why[placed]}"), str(refused.value)
        assert "download" not in str(refused.value).split(";")[0]  # the cause is the file, not the network
        assert not (root / fmt.folder).exists()
    assert os.path.lexists(archive) and (before is None or archive.read_bytes() == before)


def test_cifar_download_error_is_reported(tmp_path, monkeypatch):
    fmt = cifar.FORMATS["cifar10"]
    monkeypatch.setitem(cifar.FORMATS, "cifar10", type(fmt)(**{**fmt.__dict__, "url": "http://127.0.0.1:9/x.tar.gz"}))
    with pytest.raises(DataError, match="could not download"):
        cifar.load_cifar("cifar10", tmp_path, download=True)


# --- image folders --------------------------------------------------------------------------------

def make_folders(root: Path) -> None:
    write_image(root / "train" / "cat" / "a.png", "RGB", (40, 30))
    write_image(root / "train" / "cat" / "b.png", "L", (20, 20))  # grey
    write_image(root / "train" / "dog" / "c.png", "RGBA", (50, 64))
    write_image(root / "train" / "dog" / "d.jpg", "CMYK", (33, 17))
    write_image(root / "val" / "cat" / "e.png", "P", (32, 32))  # palette
    write_image(root / "val" / "dog" / "f.png", "I;16", (32, 32))  # 16-bit grey
    (root / "train" / "dog" / "notes.txt").write_text("not an image")  # ignored: not an image extension


def test_image_folders_convert_every_mode_to_rgb(tmp_path, make_config):
    make_folders(tmp_path)
    train, val, classes = load_image_folders(tmp_path)
    assert classes == ["cat", "dog"] and len(train) == 4 and len(val) == 2
    assert [label for _, label in val.samples] == [0, 1]
    cfg = make_config(data={"name": "imagefolder", "root": str(tmp_path), "batch_size": 2},
                      model={"img_size": 32, "patch_size": 8})
    data = build_data(cfg, torch.device("cpu"))
    images, labels = next(iter(data.train_loader))
    assert images.shape == (2, 3, 32, 32) and images.dtype == torch.float32 and labels.shape == (2,)
    assert data.train_unreadable.seen == set()
    val_images, _ = next(iter(data.val_loader))
    assert val_images.shape == (2, 3, 32, 32)


@pytest.mark.parametrize("breakage, message", [
    (lambda root: None, "does not exist"),
    (lambda root: (root / "train").mkdir(parents=True), "has no val/"),
    (lambda root: (make_folders(root), (root / "train" / "cat" / "a.png").unlink(),
                   (root / "train" / "cat" / "b.png").unlink()), "with no images in .*: cat"),
    (lambda root: (make_folders(root), (root / "val" / "bird").mkdir()), "val/ has 'bird' that train/ lacks"),
    (lambda root: (make_folders(root), shutil.rmtree(root / "val" / "cat")), "val/ lacks 'cat'"),
    (lambda root: ((root / "train").mkdir(parents=True), (root / "val").mkdir()), "has no class folders"),
])
def test_bad_image_folders_are_explained(tmp_path, breakage, message):
    root = tmp_path / "images"
    breakage(root)
    with pytest.raises(DataError, match=message):
        load_image_folders(root)


# --- order and augmentation randomness -----------------------------------------------------------

def test_sampler_order_is_a_function_of_seed_and_epoch():
    sampler = EpochSampler(50, seed=1)
    sampler.set_epoch(0)
    first = list(sampler)
    assert list(sampler) == first  # repeatable
    assert sorted(i for i, _ in first) == list(range(50))
    sampler.set_epoch(1)
    assert [i for i, _ in sampler] != [i for i, _ in first]
    sampler.set_epoch(0, start=20)
    assert list(sampler) == first[20:] and len(sampler) == 30
    assert [i for i, _ in EpochSampler(50, seed=2)] != [i for i, _ in first]


def test_seeded_augmentation_is_repeatable_and_leaves_the_global_rng_alone():
    from torchvision.transforms import v2
    images = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    data = TransformedDataset(TensorImages(images, torch.arange(4)), v2.RandomCrop(16, padding=4))
    torch.manual_seed(0)
    expected_next = torch.rand(1)
    torch.manual_seed(0)
    a, _, _ = data[(2, 12345)]
    assert torch.equal(torch.rand(1), expected_next)
    b, _, _ = data[(2, 12345)]
    c, _, _ = data[(2, 999)]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_batches_do_not_depend_on_the_number_of_workers(make_config):
    batches = {}
    for workers in (0, 2):
        cfg = make_config(data={"num_workers": workers, "train_size": 96})
        data = build_data(cfg, torch.device("cpu"))
        data.train_sampler.set_epoch(1)
        batches[workers] = [b for b in data.train_loader]
    assert len(batches[0]) == 3
    for (x0, y0), (x2, y2) in zip(batches[0], batches[2]):
        assert torch.equal(x0, x2) and torch.equal(y0, y2)


def test_batch_larger_than_the_data_set_is_refused(make_config):
    with pytest.raises(DataError, match="larger than the training set"):
        build_data(make_config(data={"train_size": 16, "batch_size": 32}), torch.device("cpu"))


# --- unreadable images ----------------------------------------------------------------------------

def make_faulty_folders(root: Path) -> None:
    """Readable images plus a truncated PNG, an empty .jpg and a text file."""
    write_image_folder(root, {"train": 6, "val": 2}, ("cat", "dog"))  # black 20x20 RGB
    good = (root / "train" / "cat" / "0.png").read_bytes()
    Image.effect_noise((64, 64), 50).convert("RGB").save(root / "train" / "cat" / "big.png")
    truncated = (root / "train" / "cat" / "big.png").read_bytes()
    (root / "train" / "cat" / "big.png").write_bytes(truncated[: len(truncated) // 2])
    (root / "train" / "dog" / "empty.jpg").write_bytes(b"")
    (root / "train" / "dog" / "readme.txt").write_text("notes")
    assert good  # the readable ones stay readable


def test_unreadable_images_are_replaced_logged_once_and_counted(tmp_path, make_config, caplog):
    make_faulty_folders(tmp_path)
    cfg = make_config(data={"name": "imagefolder", "root": str(tmp_path), "batch_size": 2, "max_bad_fraction": 0.5},
                      model={"img_size": 16, "patch_size": 8})
    data = build_data(cfg, torch.device("cpu"))
    assert len(data.train_loader.dataset) == 14  # 12 good + truncated + empty; readme.txt ignored
    for _ in range(2):  # two epochs: each bad path is logged once, counted each time
        data.train_sampler.set_epoch(0)
        for images, labels in data.train_loader:  # the loader checks each batch's unreadable images
            assert torch.isfinite(images).all()
    warnings = [r.getMessage() for r in caplog.records if "unreadable train image replaced" in r.getMessage()]
    assert len(warnings) == 2 and any("big.png" in w for w in warnings) and any("empty.jpg" in w for w in warnings)
    assert data.train_unreadable.replaced == 4
    data.train_unreadable.report(epoch=1)
    assert data.train_unreadable.replaced == 0 and "4 unreadable train images replaced" in caplog.text


def test_unreadable_images_stop_the_run_in_error_mode_and_past_the_fraction(tmp_path, make_config):
    from vit_train.train.trainer import train
    make_faulty_folders(tmp_path)
    base = {"name": "imagefolder", "root": str(tmp_path), "batch_size": 2}
    model = {"img_size": 16, "patch_size": 8}
    with pytest.raises(DataError, match=r"(big.png|empty.jpg) cannot be read .*set data.bad_images=skip"):
        train(make_config(data={**base, "bad_images": "error"}, model=model), tmp_path / "run_error")
    with pytest.raises(DataError, match=r"2 of 14 train images are unreadable, more than data.max_bad_fraction=0.1; "
                                        r"first: .* \(fix or remove them, or raise data.max_bad_fraction to train"):
        train(make_config(data={**base, "max_bad_fraction": 0.1}, model=model), tmp_path / "run_fraction")
    results = train(make_config(data={**base, "max_bad_fraction": 0.2}, model=model,
                                trainer={"max_steps": 14}), tmp_path / "run_skip")
    assert results["status"] == "completed" and results["steps"] == 14


def test_an_unreadable_val_image_stops_the_run_even_where_training_images_are_replaced(image_folder, tmp_path,
                                                                                       make_config):
    """A replaced val image would be counted twice and its class short: the val top-1 of another set."""
    from vit_train.train.trainer import train
    (image_folder / "val" / "blue" / "3.png").write_bytes(b"not a png")
    cfg = make_config(data={"name": "imagefolder", "root": str(image_folder), "batch_size": 4,
                            "bad_images": "skip", "max_bad_fraction": 1.0}, model={"img_size": 16, "patch_size": 8},
                      trainer={"max_steps": 2})
    with pytest.raises(DataError) as stopped:
        train(cfg, tmp_path / "run")
    assert str(stopped.value).startswith(f"val image {image_folder / 'val' / 'blue' / '3.png'} cannot be read (")
    assert "\n" not in str(stopped.value)


def test_an_empty_val_class_folder_is_named_in_a_warning(image_folder, make_config, caplog):
    for path in (image_folder / "val" / "green").iterdir():
        path.unlink()
    cfg = make_config(data={"name": "imagefolder", "root": str(image_folder), "batch_size": 4},
                      model={"img_size": 16, "patch_size": 8})
    data = build_data(cfg, torch.device("cpu"))
    assert len(data.val_loader.dataset) == 8 and data.class_names == ["blue", "green", "red"]
    assert "val class folder(s) with no images in" in caplog.text and caplog.text.count("green") == 1

