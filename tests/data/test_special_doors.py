"""Every door that reads a file the user names refuses a FIFO, socket, device, folder named like a file
or link loop in one line, without opening it (issue 23): ckpt=, resume=, model.pretrained=,
objective.teacher=, vit-predict's images, CIFAR batch files and an image opened by decode.open_rgb
(a FIFO opened for reading blocks until a writer comes: forever). Calls that could block run in a
thread with a deadline, and every FIFO gets a writer at the end, so a regression fails, not hangs."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.images import write_cifar10, write_image, write_image_folder
from helpers.special_files import DEADLINE, make_socket, release, within
from vit_train.data.sources.cifar import find_folder, load_cifar
from vit_train.data.decoding.image import open_rgb
from vit_train.data.decoding.image import UnreadableImage, describe_unreadable
from vit_train.data.sources.imagefolder_files import load_image_folders
from vit_train.data.decoding.regular import NotRegularFile, not_regular
from vit_train.errors import CheckpointError, ConfigError, DataError
from vit_train.checkpoint import find_resume_checkpoint, resolve
from vit_train.runtime.preemption import StopRequest
from vit_train.tools.predict import read_image

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and sockets are POSIX")

@pytest.fixture
def specials(tmp_path):
    """{kind: path} of special files named like files; FIFOs are given a writer at teardown, so that a
    read left blocked on one by a failing test ends."""
    folder = tmp_path / "specials"
    folder.mkdir()
    os.mkfifo(folder / "fifo.pt")
    make_socket(folder / "sock.pt")
    (folder / "dev.pt").symlink_to("/dev/zero")  # endless: a read never ends
    (folder / "loop.pt").symlink_to(folder / "loop.pt")
    (folder / "dir.pt").mkdir()
    yield {"a FIFO": folder / "fifo.pt", "a socket": folder / "sock.pt", "a character device": folder / "dev.pt",
           "a link loop": folder / "loop.pt", "a folder": folder / "dir.pt"}
    release(folder / "fifo.pt")


def test_not_regular_names_each_kind_without_opening(specials, tmp_path):
    (tmp_path / "broken.pt").symlink_to(tmp_path / "gone.pt")
    (tmp_path / "file.pt").write_bytes(b"x")
    for kind, path in specials.items():
        assert within(DEADLINE, not_regular, path) == kind
    assert not_regular(tmp_path / "broken.pt") == "a broken link"
    assert not_regular(tmp_path / "nothing.pt") == "missing"
    assert not_regular(tmp_path / "file.pt") is None


@pytest.mark.parametrize("key", ["ckpt", "model.pretrained", "objective.teacher"])
def test_weights_doors_refuse_special_files_in_one_line(specials, key):
    for kind, path in specials.items():
        if kind == "a folder":  # a folder is read as a run directory: its own message
            with pytest.raises(ConfigError, match=f"^{key}={path} is a directory but no vit-train run directory"):
                within(DEADLINE, resolve, str(path), key)
            continue
        with pytest.raises(ConfigError) as e:
            within(DEADLINE, resolve, str(path), key)
        assert str(e.value) == (f"{key}={path} is {kind}, not a file to read weights from; give a vit-train run "
                                f"directory or checkpoint (.pt), a .safetensors file, a Hub folder (config.json, "
                                f"model.safetensors), or a timm, DeiT or torchvision state dict")


def test_resume_refuses_special_files_in_one_line(specials, tmp_path):
    for kind, path in specials.items():
        if kind == "a folder":
            continue  # a run directory without checkpoints: test_cli's message
        with pytest.raises(CheckpointError) as e:
            within(DEADLINE, find_resume_checkpoint, str(path), tmp_path)
        assert str(e.value) == f"resume path {path} is {kind}, not a file or a folder; give a run directory or a .pt checkpoint"


def test_a_run_directory_whose_checkpoints_are_special_files_is_never_blocked_on(specials, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    os.mkfifo(run / "checkpoints" / "last.pt")
    (run / "checkpoints" / "best.pt").symlink_to("/dev/zero")
    try:
        with pytest.raises(CheckpointError) as e:
            within(DEADLINE, find_resume_checkpoint, str(run), run)
        assert str(e.value) == (f"{run} holds no checkpoints (best.pt is a character device, last.pt is a FIFO); give "
                                f"a run directory that has some (in checkpoints/), or a .pt file")
        with pytest.raises(ConfigError, match="holds no checkpoints"):
            within(DEADLINE, resolve, str(run), "ckpt")
    finally:
        release(run / "checkpoints" / "last.pt")


@pytest.mark.parametrize("kind", ["a FIFO", "a socket", "a character device", "a folder"])
def test_open_rgb_refuses_a_special_file_without_blocking(specials, tmp_path, kind):
    named = tmp_path / f"x{kind.split()[-1]}.png"
    named.symlink_to(specials[kind])
    with pytest.raises(NotRegularFile) as e:
        within(DEADLINE, open_rgb, named)
    assert str(e.value) == f"{named} is {kind}, not a regular file"
    with pytest.raises(DataError, match=rf"^{named} cannot be read as an image \(NotRegularFile: {named} is {kind}"):
        within(DEADLINE, read_image, named)  # vit-predict's reader


def test_open_rgb_on_a_link_loop_and_a_missing_file(specials, tmp_path):
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        open_rgb(specials["a link loop"])
    with pytest.raises(FileNotFoundError):
        open_rgb(tmp_path / "none.png")


def test_an_image_replaced_by_a_fifo_after_listing_is_an_unreadable_image(tmp_path):
    """The listing is taken at start-up; a file swapped for a FIFO later meets open_rgb's own check and
    goes to the unreadable-image policy (skip or stop, docs/data.md), never a blocked worker."""
    write_image_folder(tmp_path, {"train": 2, "val": 1}, classes=("a", "b"))
    train, _, _ = load_image_folders(tmp_path)
    victim = Path(train.samples[1][0])
    victim.unlink()
    os.mkfifo(victim)
    try:
        assert within(DEADLINE, train.__getitem__, 0)[1] == 0
        with pytest.raises(UnreadableImage):
            within(DEADLINE, train.__getitem__, 1)
        assert within(DEADLINE, describe_unreadable, str(victim)) == f"NotRegularFile: {victim} is a FIFO, not a regular file"
    finally:
        release(victim)


@pytest.mark.parametrize("kind", ["a FIFO", "a folder", "a character device", "a link loop"])
def test_cifar_batch_files_that_are_not_regular_files_are_named(tmp_path, kind):
    write_cifar10(tmp_path)
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_2"
    batch.unlink()
    if kind == "a FIFO":
        os.mkfifo(batch)
    elif kind == "a folder":
        batch.mkdir()
    elif kind == "a character device":
        batch.symlink_to("/dev/zero")
    else:
        batch.symlink_to(batch)
    with pytest.raises(DataError) as e:
        within(DEADLINE, find_folder, "cifar10", tmp_path, False)
    assert str(e.value) == (f"CIFAR-10 folder {tmp_path / 'cifar-10-batches-py'}: data_batch_2 is {kind}, not a "
                            f"regular file; put the batch files there (delete the folder and rerun with "
                            f"data.download=true to fetch them)")


def test_cifar_reads_a_sound_folder_as_before(tmp_path):
    write_cifar10(tmp_path)
    (train_x, _), (test_x, _), names = load_cifar("cifar10", tmp_path, download=False)
    assert len(names) == 10 and train_x.shape[1:] == (3, 32, 32) and len(test_x) > 0


def test_a_stop_signal_in_a_forked_copy_is_left_to_the_training_process():
    """A loader worker forked while the run's stop handler is installed has it until its own handlers
    (data/__init__.py _worker_signals) replace it: a group SIGTERM in that window made the worker say
    "received SIGTERM" as if it were the run. The copy now ignores it; the run's process still acts."""
    read, write = os.pipe()
    with StopRequest() as stop:
        pid = os.fork()
        if pid == 0:  # the copy
            os.close(read)
            os.kill(os.getpid(), signal.SIGTERM)
            os.write(write, b"said" if stop.received else b"quiet")
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as answer:
            told = answer.read()
        os.waitpid(pid, 0)
        assert told == b"quiet"
        os.kill(os.getpid(), signal.SIGTERM)  # the process that installed it still stops
        assert stop.received == signal.SIGTERM


@pytest.mark.slow  # two command starts (~20 s here); the doors' lines are checked in the fast tests above
def test_vit_eval_and_resume_refuse_a_fifo_in_one_line_and_exit_2(specials, tmp_path):
    fifo = specials["a FIFO"]
    runs = [
        [sys.executable, "-c", "import sys; from vit_train.cli.commands import eval_main as m; sys.argv[0] = 'x'; m()",
         f"ckpt={fifo}"],
        [sys.executable, "-m", "vit_train", f"resume={fifo}", "trainer.device=cpu", f"hydra.run.dir={tmp_path / 'r'}"],
    ]
    said = [f"vit-eval: error: ckpt={fifo} is a FIFO, not a file to read weights from; give a vit-train run directory "
            f"or checkpoint (.pt), a .safetensors file, a Hub folder (config.json, model.safetensors), or a timm, DeiT "
            f"or torchvision state dict",
            f"vit-train: error: resume path {fifo} is a FIFO, not a file or a folder; give a run directory or a .pt "
            f"checkpoint"]
    for argv, line in zip(runs, said):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines() == [line]


WORKER_SIGNALS = """
import os, signal, sys
import torch.utils.data._utils.worker as worker
real_loop = worker._worker_loop

def loop(*args, **kwargs):  # a loader worker as it starts, before its own handlers: the group is signalled
    if args[10] == 0 and not os.path.exists("signalled"):  # worker_id; the first start-up only
        open("signalled", "w").close()
        os.killpg(os.getpgid(0), signal.SIGTERM)
    return real_loop(*args, **kwargs)

worker._worker_loop = loop
from vit_train.cli.train import train_main
sys.argv = ["vit-train", *sys.argv[1:]]
train_main()
"""


@pytest.mark.slow
def test_a_group_sigterm_at_loader_start_up_leaves_only_the_runs_own_lines(tmp_path):
    """SIGTERM to the process group while loader workers start (as SLURM sends it): the run stops with
    143 and a checkpoint; its console and train.log say "received SIGTERM" once (the workers said it too)."""
    write_image_folder(tmp_path / "data", {"train": 16, "val": 4}, classes=("a", "b"))
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", WORKER_SIGNALS, "data=imagefolder", f"data.root={tmp_path / 'data'}",
                           "data.num_workers=2", "model.embed_dim=32", "model.depth=2", "model.num_heads=2",
                           "model.img_size=16", "data.batch_size=8", "trainer.device=cpu", "trainer.progress=false",
                           "trainer.epochs=2", f"hydra.run.dir={run}"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    output = done.stdout + done.stderr
    assert (tmp_path / "signalled").exists()
    assert done.returncode == 143, output
    assert output.count("received SIGTERM") == 1, output
    assert "Traceback" not in output and "Error" not in output, output
    assert (run / "train.log").read_text().count("received SIGTERM") == 1
    assert (run / "checkpoints" / "last.pt").is_file()
    assert output.strip().splitlines()[-1].startswith("vit-train: stopped by SIGTERM at step 0;")
