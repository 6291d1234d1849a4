"""The real command line, in a subprocess, run from a directory that is not the checkout."""

from pathlib import Path

import pytest

from helpers.configs import TINY
from helpers.files import read_results
from helpers.runs import vit_train


def test_train_from_another_directory_writes_the_run_layout(tmp_path):
    done = vit_train(*TINY, "trainer.max_steps=3", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    runs = list((tmp_path / "outputs").glob("*/*"))
    assert len(runs) == 1
    run = runs[0]
    assert len(run.parent.name) == 10 and len(run.name) == 8  # outputs/YYYY-MM-DD/HH-MM-SS
    for name in (".hydra/config.yaml", ".hydra/overrides.yaml", "train.log", "metrics.jsonl", "results.json",
                 "checkpoints/last.pt", "checkpoints/best.pt"):
        assert (run / name).is_file(), name
    assert list((run / "tb").glob("events.out.tfevents.*"))
    assert read_results(run)["steps"] == 3
    assert "completed: best top-1" in done.stdout


@pytest.mark.slow  # ~14 s on 2 cores; resume=<dir> is also covered in-process
def test_resume_a_run_directory_continues_there_with_its_saved_config(tmp_path):
    run = tmp_path / "run"
    first = vit_train(*TINY, "trainer.max_steps=3", f"hydra.run.dir={run}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    # only the new limit is given: the tiny model and data come from the checkpoint's config
    again = vit_train(f"resume={run}", "trainer.max_steps=6", "trainer.progress=false", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert read_results(run)["steps"] == 6
    assert not (tmp_path / "outputs").exists()  # no new run directory
    assert "resumed from" in (run / "train.log").read_text()
    assert "trainer.max_steps: 3 -> 6" in again.stdout
    assert "model.depth=2" in (run / ".hydra" / "overrides.yaml").read_text()  # the original record is kept

    group = vit_train(f"resume={run}", "model=vit_tiny", cwd=tmp_path)
    assert group.returncode == 2 and "picks a config group" in group.stderr


def test_print_config(tmp_path):
    done = vit_train("--cfg", "job", "model=vit_base", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "embed_dim: 768" in done.stdout and "num_heads: 12" in done.stdout
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("args, message", [  # three fast, the others slow: to keep `pytest` near 5 minutes
    (["optim.learning_rate=1e-3"], "unknown config key 'optim.learning_rate'; did you mean 'optim.lr'?"),
    pytest.param(["model.patch_size=5"], "model.img_size (32) must be divisible by model.patch_size (5)",
                 marks=pytest.mark.slow),
    pytest.param(["model.embed_dim=100", "model.num_heads=3"],
                 "model.embed_dim (100) must be divisible by model.num_heads (3)", marks=pytest.mark.slow),
    pytest.param(["data.batch_size=0"], "data.batch_size must be > 0", marks=pytest.mark.slow),
    pytest.param(["optim.lr=0"], "optim.lr must be > 0", marks=pytest.mark.slow),
    (["trainer.precision=fp8"], "trainer.precision must be one of auto, bf16, fp16, fp32"),
    pytest.param(["data=imagefolder"], "needs data.root", marks=pytest.mark.slow),
    (["data=imagefolder", "data.root={tmp}"], "has no train/ or val/"),
    pytest.param(["data=cifar10", "data.root={tmp}", "data.download=false"], "no CIFAR-10 batches under",
                 marks=pytest.mark.slow),
    pytest.param(["resume={tmp}/missing"], "does not exist", marks=pytest.mark.slow),
])
def test_bad_input_is_one_clear_line_and_leaves_nothing_behind(tmp_path, args, message):
    done = vit_train(*[a.format(tmp=tmp_path) for a in args], cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("vit-train: error: ")
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob("outputs/*/*"))


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_unknown_group_option_lists_the_valid_ones(tmp_path):
    done = vit_train("model=vit_gigantic", cwd=tmp_path)  # no such option
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and not (tmp_path / "outputs").exists()
    assert done.stderr.startswith("vit-train: error: model=vit_gigantic is not an option; choose one of resnet18, ")


@pytest.mark.slow  # ~10 s on 2 cores; divergence is also covered in-process (test_stops.py)
def test_diverging_run_stops_with_status_3_and_keeps_the_good_checkpoint(tmp_path):
    run = tmp_path / "run"
    assert vit_train(*TINY, "trainer.epochs=1", f"hydra.run.dir={run}", cwd=tmp_path).returncode == 0
    good = (run / "checkpoints" / "last.pt").read_bytes()
    blown = vit_train(f"resume={run}", "trainer.epochs=3", "optim.lr=1e30", "trainer.max_bad_steps=3",
                      "trainer.progress=false", cwd=tmp_path)
    assert blown.returncode == 3, blown.stderr
    assert "3 steps in a row had a non-finite loss" in blown.stderr and "Traceback" not in blown.stderr
    assert (run / "checkpoints" / "last.pt").read_bytes() == good
    assert read_results(run)["status"] == "diverged"


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_a_new_run_in_a_used_directory_is_refused_and_its_record_kept(tmp_path):
    run = tmp_path / "run"
    assert vit_train(*TINY, "trainer.max_steps=2", f"hydra.run.dir={run}", cwd=tmp_path).returncode == 0
    record = (run / ".hydra" / "overrides.yaml").read_text()
    again = vit_train(*TINY, "trainer.max_steps=3", f"hydra.run.dir={run}", cwd=tmp_path)
    assert again.returncode == 2 and "already holds checkpoints; continue that run with resume=auto" in again.stderr
    assert (run / ".hydra" / "overrides.yaml").read_text() == record
    assert (run / "checkpoints" / "last.pt").is_file()


def _unwritable() -> Path:
    import tempfile

    try:
        tempfile.TemporaryFile(dir="/sys").close()
    except OSError:
        return Path("/sys")
    pytest.skip("no unwritable directory here (/sys is writable)")


def test_an_unwritable_working_directory_is_one_line_naming_hydra_run_dir(tmp_path):
    read_only = _unwritable()
    done = vit_train(*TINY, "trainer.max_steps=2", cwd=read_only)
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert f"cannot create the run directory outputs in {read_only}" in done.stderr
    assert "hydra.run.dir=/path/to/dir" in done.stderr
    from vit_train.cli.train import check_writable
    from vit_train.errors import ConfigError

    with pytest.raises(ConfigError, match=r"sweep directory .* hydra\.sweep\.dir="):
        check_writable(["optim.lr=1,2", f"hydra.sweep.dir={read_only}/a/b"], multirun=True)
    check_writable([f"hydra.run.dir={tmp_path}/new/run"])  # a writable place: no complaint, nothing created
    assert not (tmp_path / "new").exists()
