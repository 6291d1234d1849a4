"""Every command on a real full or read-only place: a tmpfs in a private mount namespace
(helpers/places.py; skipped where none can be mounted). Each case ends in one line naming the file,
exit 2, no traceback, and leaves exactly the listed entries (no half-written output, no temporary file).
All slow: each starts the real command (about 10 s on 2 CPU cores)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from helpers.configs import TINY
from helpers.places import mount_namespace, on_place

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(mount_namespace() is None, reason="cannot mount a tmpfs here (no unshare, no user "
                                                                   "namespaces); test_output_places.py forces the faults")]
PY = shlex.quote(sys.executable)


def cli(name: str) -> str:
    """The shell words that run command `name` (vit-eval ... by this interpreter, as the console script does)."""
    module, function = ("vit_train.sweeps.summary", "main") if name == "sweep-summary" else \
        ("vit_train.cli.train", "train_main") if name == "train" else ("vit_train.cli.commands", f"{name}_main")
    return f"{PY} -c 'import sys; sys.argv[0] = \"vit-{name}\"; from {module} import {function}; {function}()'"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from helpers.configs import tiny_config
    from vit_train.train.trainer import train

    run_dir = tmp_path_factory.mktemp("run")
    train(tiny_config(trainer={"max_steps": 2}), run_dir)
    return run_dir / "checkpoints" / "last.pt"


def sweep_setup() -> str:
    """Shell lines that make a two-job sweep directory (records and results, no training) at $PLACE/sweep."""
    lines = []
    for job, lr in enumerate(["0.001", "0.0005"]):
        folder = f"$PLACE/sweep/{job}"
        results = json.dumps({"status": "completed", "best_top1": 10.0 + job})
        lines += [f"mkdir -p {folder}/.hydra", f"echo '- optim.lr={lr}' > {folder}/.hydra/overrides.yaml",
                  f"echo '{results}' > {folder}/results.json"]
    return " && ".join(lines)


SWEEP_FILES = {"sweep", "sweep/0", "sweep/0/.hydra", "sweep/0/.hydra/overrides.yaml", "sweep/0/results.json",
               "sweep/1", "sweep/1/.hydra", "sweep/1/.hydra/overrides.yaml", "sweep/1/results.json"}

# name: (command, size in kB, read-only, set-up, what the line says, the entries left)
CASES = {
    "export safetensors, read-only": ("export ckpt={ckpt} out=$PLACE/m.safetensors", 1024, True, "",
                                      "could not write {place}/m.safetensors: the file system there is read-only", set()),
    "export safetensors, full": ("export ckpt={ckpt} out=$PLACE/m.safetensors", 8, False, "",
                                 "could not write {place}/m.safetensors: no space left on {place}", set()),
    "export onnx, full": ("export ckpt={ckpt} out=$PLACE/m.onnx", 20, False, "",
                          "could not write {place}/m.onnx: no space left on {place}", set()),
    "eval, read-only": ("eval ckpt={ckpt} out=$PLACE/eval progress=false", 1024, True, "",
                        "could not write {place}/eval: the file system there is read-only; give another out=", set()),
    "eval, full": ("eval ckpt={ckpt} out=$PLACE/eval progress=false", 60, False, "",
                   "no space left on {place}", set()),  # the out= folder it made is removed again
    "predict, stdout to a full file": ("predict ckpt={ckpt} images=[{image}] --json > $PLACE/p.json", 4, False,
                                       "head -c 4096 /dev/zero > $PLACE/pad || true",
                                       "could not write {place}/p.json: no space left on {place}", {"pad", "p.json"}),
    "sweep summary, read-only": ("sweep-summary $PLACE/sweep", 1024, True, "SWEEP",
                                 "could not write {place}/sweep/summary.csv: the file system there is read-only",
                                 SWEEP_FILES),
    "sweep summary, full": ("sweep-summary $PLACE/sweep", 64, False, "SWEEP && head -c 65536 /dev/zero > $PLACE/pad || true",
                            "could not write {place}/sweep/summary.csv: no space left on {place}", SWEEP_FILES | {"pad"}),
    "train, full before .hydra": ("train " + " ".join(TINY) + " hydra.run.dir=$PLACE/run", 2, False, "",
                                  "could not write {place}/run/.hydra/config.yaml: no space left on {place}", set()),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_command_on_a_full_or_read_only_place_is_one_line_and_leaves_nothing_half_written(case, checkpoint,
                                                                                          tmp_path):
    from PIL import Image

    image = tmp_path / "a.png"
    Image.new("RGB", (16, 16), "red").save(image)
    words, size, read_only, before, says, left = CASES[case]
    name, _, args = words.partition(" ")
    line = f"{cli(name)} {args.format(ckpt=checkpoint, image=image)}"
    done = on_place(tmp_path, line, size, read_only, before.replace("SWEEP", sweep_setup()))
    prog = f"vit-{name}"
    assert done["rc"] == 2, done
    assert "Traceback" not in done["stderr"], done["stderr"]
    errors = [x for x in done["stderr"].splitlines() if x.startswith(f"{prog}: error: ")]
    assert len(errors) == 1 and says.format(place=tmp_path / "place") in errors[0], done["stderr"]
    assert set(done["left"]) == left and not done["tmp"], done["left"]
    if "p.json" in left:  # the output file is cut back to nothing: no shorter list that looks complete
        assert done["left"]["p.json"] == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # sha256("")
