"""A non-editable install (the built wheel) finds its configs from any working directory."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    pytest.importorskip("setuptools")
    tmp = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    wheel = next((tmp / "dist").glob("vit_train-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "--target", str(tmp / "site"), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    return tmp / "site"


def run_installed(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}  # ahead of any editable install of the checkout
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_wheel_ships_every_config_file(installed):
    shipped = sorted(p.relative_to(installed / "vit_train" / "configs") for p in installed.glob("vit_train/configs/**/*.yaml"))
    source = sorted(p.relative_to(ROOT / "configs") for p in (ROOT / "configs").glob("**/*.yaml"))
    assert shipped == source


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_installed_package_trains_from_another_directory(installed, tmp_path):
    where = run_installed(installed, tmp_path, "-c", "import vit_train.cli.train as c; print(c.__file__, c._config_dir())")
    assert where.returncode == 0, where.stderr
    module_file, config_dir = where.stdout.split()
    assert module_file.startswith(str(installed)) and config_dir.startswith(str(installed))

    done = run_installed(installed, tmp_path, "-m", "vit_train", "trainer=debug", "data.train_size=64",
                         "data.val_size=32", "data.batch_size=16", "model.img_size=16", "trainer.progress=false")
    assert done.returncode == 0, done.stderr
    assert len(list(tmp_path.glob("outputs/*/*/checkpoints/last.pt"))) == 1
