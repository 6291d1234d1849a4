"""Every command line of README.md and docs/*.md runs (slow suite), read from the pages (tests/helpers/doc_pages.py),
so an example added to a page is run without being listed here.

A block's commands run in order in one folder of their own, with tiny settings (`tiny`: 2 steps, small images,
the CPU) and what the page assumes put in by the test: a small data set of the documented kind wherever a command's
`data.root` points (CIFAR's own batches, an image folder, WebDataset shards written by vit-shards, a Hugging Face
set); a documented absolute path (/data/imagenet) is a folder under the block's own, the same in every command of
the block (vit-shards' `out=` is the next command's `data.root`); a checkpoint or run directory the page names
(outputs/<date>/<time>/checkpoints/best.pt, RUN/, PATH/...) is the block's newest run, or a tiny run of the
command's own model and data where the block made none; images for vit-predict. A command shown with its refusal
under it must end with exit status 2 and that line. Scripts run with tiny sizes of their own flags; torchrun on the
CPU with 2 processes at most. A block the machine cannot run says so on the line before its fence
(`<!-- needs: WHAT -->`); `test_only_blocks_marked_needs_are_left_out` holds every other block to running.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.doc_pages import ROOT, Block, Command, commands_of, doc_blocks, steps

BLOCKS = doc_blocks()
PATH_KEYS = ("resume", "model.pretrained", "objective.teacher", "ckpt")
IN_PROCESS = ("vit-train", "vit-eval", "vit-predict", "vit-export", "vit-shards", "vit-sweep-summary")
# A run's length and size: what a shown command sets of these is replaced (a swept value is kept).
TINY_RUN = {"trainer.max_steps": "2", "trainer.device": "cpu", "trainer.progress": "false",
            "data.train_size": "512", "data.val_size": "64", "data.batch_size": "16", "data.num_workers": "0"}
ON_DISK = ("cifar10", "cifar100", "imagefolder", "webdataset", "hf")
# Each script's flags for a tiny run: what a shown command sets of these is replaced.
TINY_SCRIPT = {
    "bench_data.py": {"--images": "40", "--size": "60x45", "--rounds": "1", "--batch": "8", "--img-size": "16",
                      "--shuffle-buffer": "8", "--short-side": "24", "--workers": "0"},
    "benchmark.py": {"--model": "vit_micro", "--img-size": "16", "--batch-size": "8", "--rounds": "1", "--steps": "1",
                     "--pipeline-images": "0", "--precision": "fp32"},
    "bench_threads.py": {"--steps": "1", "--rounds": "1", "--busy": "0"},
    "bench_startup.py": {"--runs": "1"},
    "shapes_folder.py": {"--train": "100", "--val": "20"},
    # --smoke (a flag, no value): a recipe's own epochs cut to two (scripts/mae_demo.py fit_recipe), val sets small
    "mae_demo.py": {"--unlabelled": "64", "--labelled": "64", "--pretrain-epochs": "1", "--finetune-epochs": "1",
                    "--lp-epochs": "1", "--seeds": "0", "--smoke": None},
}


def why_not_here(command: Command) -> str | None:
    """Why this machine cannot run `command` as the page shows it (its block then needs a `needs:` line), or None."""
    program = command.program
    if program in IN_PROCESS or program == "cd":
        return None
    if program == "torchrun":
        procs = next((int(a.split("=")[1]) for a in command.argv if a.startswith("--nproc_per_node=")), 1)
        if procs > 2 or any(a.startswith("--nnodes") for a in command.argv):
            return f"{procs} processes a node, or several nodes"
        return None
    if program.startswith("script "):
        name = program.split()[1]
        return None if name in TINY_SCRIPT else f"scripts/{name}: no tiny settings known for it"
    if program == "pytest" and any(a.startswith("tests/") for a in command.argv):
        return None  # a few test files
    return f"{program}: not run here (the network, a cluster, or the whole test suite)"


def test_the_pages_show_every_tool():
    found = [c.program for b in BLOCKS for c in b.commands]
    for program in IN_PROCESS + ("torchrun", "script gpu_acceptance.py"):
        assert program in found, program
    assert found.count("vit-eval") >= 7 and found.count("vit-predict") >= 4 and found.count("vit-shards") >= 5


def test_only_blocks_marked_needs_are_left_out():
    """A command this test cannot run is in a block marked `<!-- needs: WHAT -->`, with the reason, or one
    another test runs (`<!-- run by: FILE::TEST -->`)."""
    unmarked = [f"{b.id} line {c.line}: {why}" for b in BLOCKS if b.needs is None and b.run_by is None
                for c in b.commands if (why := why_not_here(c))]
    assert not unmarked, "\n".join(unmarked)
    left_out = [f"{b.id}: needs {b.needs}" for b in BLOCKS if b.needs]
    print(f"{len(BLOCKS)} blocks, {len(left_out)} left out:\n" + "\n".join(left_out))


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in BLOCKS if b.run_by])
def test_a_block_run_by_another_test_is_run_there_as_shown(block: Block):
    """The named test exists and its source has the block's script and every flag of its commands."""
    path, name = block.run_by
    source = (ROOT / path).read_text()
    body = source[source.index(f"def {name}("):]
    body = body[:re.search(r"\n(?:@|def |class )", body[1:]).start() + 1] if re.search(r"\n(?:@|def |class )",
                                                                                    body[1:]) else body
    for command in block.commands:
        assert re.search(r"\b" + re.escape(Path(command.argv[1]).name.removesuffix(".py")), source), command.argv
        for flag in (w for w in command.argv if w.startswith("--")):
            assert f'"{flag}"' in body, (flag, name)


def test_the_reading_of_a_block():
    text = ("$ vit-train optim.lr=1e-3 \\\n    trainer.epochs=3   # fine\nvit-train: error: no\n"
            "OMP_NUM_THREADS=1 python scripts/benchmark.py --rounds 7\noutputs/x (step 2): done\n"
            "cd /a && vit-train x=1\npython -m vit_train y=2\ntorchrun --nproc_per_node=8 -m vit_train\n")
    found = commands_of(text, 10)
    assert [(c.line, c.program) for c in found] == [(10, "vit-train"), (13, "script benchmark.py"), (15, "cd"),
                                                  (16, "vit-train"), (17, "torchrun")]
    assert found[0].argv == ["vit-train", "optim.lr=1e-3", "trainer.epochs=3"] and found[0].error == "vit-train: error: no"
    assert found[1].env == {"OMP_NUM_THREADS": "1"} and steps(found[2]) == [["cd", "/a"], ["vit-train", "x=1"]]
    assert why_not_here(found[4]) and not why_not_here(found[1])


# ---------------------------------------------------------------- running a block

def mapped(arg: str, tmp: Path) -> str:
    """`arg` with each absolute path it names moved under `tmp` (/data/x -> TMP/data/x)."""
    return re.sub(r"""(^|[=\[,'"])/(?=[^/\s])""", lambda m: f"{m.group(1)}{tmp}/", arg)


def unquoted(value: str) -> str:
    return value[1:-1] if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"" else value


def option(args: list[str], key: str, default: str | None = None) -> str | None:
    found = [unquoted(a.split("=", 1)[1]) for a in args if a.split("=", 1)[0] == key]
    return found[-1] if found else default


def tiny(args: list[str], replace: bool = True, size: bool = False, shapes: bool = True) -> list[str]:
    """`args` with TINY_RUN's values for a run's length and size (with `size`, 32x32 images too; the data set's
    size where it is `shapes`), the flags (--cfg job) kept last. Without `replace`, only the keys not given are
    added (a command shown refused keeps what it is refused for)."""
    keys = {a.split("=", 1)[0] for a in args if "=" in a}
    swept = {a.split("=", 1)[0] for a in args if "=" in a and "," in a.split("=", 1)[1] and "(" not in a}
    settings = dict(TINY_RUN, **({"model.img_size": "32"} if size and "model.img_size" not in keys else {}))
    if not shapes:
        settings = {k: v for k, v in settings.items() if k not in ("data.train_size", "data.val_size")}
    if any(a.startswith("hparams_search=") for a in args) or "hydra.sweeper.n_trials" in keys:
        settings["hydra.sweeper.n_trials"] = "2"
    drop = set(settings) - swept if replace else set()
    kept = [a for a in args if "=" not in a or a.split("=", 1)[0] not in drop]
    extra = [f"{k}={v}" for k, v in settings.items() if k not in swept and (replace or k not in keys)]
    at = next((k for k, a in enumerate(kept) if a.startswith("--") and a != "--multirun"), len(kept))
    at = len(kept) if at == 0 else at  # flags first: the settings go after the key=value arguments
    return kept[:at] + extra + kept[at:]


def tiny_script(name: str, args: list[str]) -> list[str]:
    """A script's arguments with TINY_SCRIPT's values for its flags (given or not)."""
    settings, out, k = TINY_SCRIPT[name], [], 0
    while k < len(args):
        flag = args[k].split("=")[0]
        if flag in settings:
            bare = settings[flag] is None or "=" in args[k] or k + 1 >= len(args) or args[k + 1].startswith("--")
            k += 1 if bare else 2
            continue
        out.append(args[k])
        k += 1
    for flag, value in settings.items():
        if (name, flag) == ("mae_demo.py", "--unlabelled") and "--folder" in out:  # the folder's images, all of them
            continue
        out += [flag] if value is None else [flag, value]
    return out


def test_tiny_keeps_sweeps_and_flags():
    assert tiny(["-m", "data.batch_size=128,256", "trainer.max_steps=40", "--cfg", "job"])[-2:] == ["--cfg", "job"]
    assert "data.batch_size=128,256" in tiny(["-m", "data.batch_size=128,256"])
    assert "trainer.max_steps=40" not in tiny(["trainer.max_steps=40"]) and "trainer.max_steps=2" in tiny([])
    assert not any(a.startswith("hydra.sweeper") for a in tiny([]))
    assert "hydra.sweeper.n_trials=2" in tiny(["hparams_search=optuna"])
    assert tiny(["--cfg", "job", "model=vit_base"])[:3] == ["--cfg", "job", "model=vit_base"]
    assert "data.batch_size=7" in tiny(["data.batch_size=7"], replace=False)
    assert "model.img_size=32" in tiny([], size=True) and "model.img_size=48" in tiny(["model.img_size=48"], size=True)
    assert tiny_script("benchmark.py", ["--rounds", "7", "--json", "--steps=9"]) == \
        ["--json", *[w for f, v in TINY_SCRIPT["benchmark.py"].items() for w in (f, v)]]
    small = tiny_script("mae_demo.py", ["--smoke", "--out", "x", "--labelled", "500", "--recipe", "experiment=y"])
    assert small.count("--smoke") == 1 and small[:4] == ["--out", "x", "--recipe", "experiment=y"]
    assert small[small.index("--labelled") + 1] == "64" and "500" not in small


def test_documented_paths_move_under_the_tests_folder():
    tmp = Path("/t")
    assert mapped("data.root=/data/imagenet", tmp) == "data.root=/t/data/imagenet"
    assert mapped("\"data.root='/data/my photos #1, [2024]'\"", tmp) == "\"data.root='/t/data/my photos #1, [2024]'\""
    assert mapped('images=["/photos/photo #1.png","/photos/a,b.jpg"]', tmp) == \
        'images=["/t/photos/photo #1.png","/t/photos/a,b.jpg"]'
    for kept in ("hydra.searchpath=[file:///path/to/my/configs]", "ckpt=runs/x/last.pt", "out=s3://bucket/x"):
        assert mapped(kept, tmp) == kept
    assert images_of('["/p/photo #1.png","/p/a,b.jpg"]') == ["/p/photo #1.png", "/p/a,b.jpg"]
    assert images_of("[cat.jpg,dog.png]") == ["cat.jpg", "dog.png"]


class Runner:
    """Runs one block's commands in `work` (a block's own folder; absolute paths under `tmp`)."""

    def __init__(self, tmp: Path, monkeypatch, capsys, runs: dict):
        self.tmp, self.monkeypatch, self.capsys, self.cache = tmp, monkeypatch, capsys, runs
        self.cwd = tmp / "home" / "me" / "vit-train"  # the pages' own working folder
        self.cwd.mkdir(parents=True)
        self.made: list[Path] = []  # the runs the block's commands made, oldest first
        self.sweeps: list[Path] = []
        self.ran: list[str] = []
        self.second = 0  # the wall-clock second the last vit-train of the block started in

    def next_second(self) -> None:
        """Wait, if need be, for a second no earlier vit-train of the block started in: a run's directory is named
        by the second it starts in (outputs/<date>/<HH-MM-SS>), and a user never types two commands in one."""
        while int(time.time()) == self.second:
            time.sleep(0.05)
        self.second = int(time.time())

    # ------------------------------------------------ the commands

    def main_of(self, program: str):
        from vit_train.cli import commands
        from vit_train.cli.train import train_main
        from vit_train.sweeps.summary import main as summary_main

        return {"vit-train": train_main, "vit-eval": commands.eval_main, "vit-predict": commands.predict_main,
                "vit-export": commands.export_main, "vit-shards": commands.shards_main,
                "vit-sweep-summary": summary_main}[program]

    def in_process(self, program: str, args: list[str]) -> tuple[int, str, str]:
        from hydra.core.global_hydra import GlobalHydra
        from hydra.initialize import get_gh_backup, restore_gh_from_backup

        from helpers.in_process import run_main

        backup = get_gh_backup()
        GlobalHydra.instance().clear()
        os.chdir(self.cwd)
        try:
            return run_main(self.main_of(program), self.monkeypatch, self.capsys, *args, prog=program)
        finally:
            restore_gh_from_backup(backup)

    def subprocess(self, argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
        environ = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]), **env,
                       PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
        done = subprocess.run(argv, cwd=self.cwd, env=environ, capture_output=True, text=True, timeout=300)
        return done.returncode, done.stdout, done.stderr

    def run(self, command: Command) -> None:
        started = time.monotonic()
        self.run_steps(command)
        self.ran[-1] += f" ({time.monotonic() - started:.1f} s)"

    def run_steps(self, command: Command) -> None:
        parts = steps(command)
        for k, words in enumerate(parts):
            words = [mapped(w, self.tmp) for w in words]
            last = k == len(parts) - 1
            expected = command.error if last else None
            if words[0] == "cd":
                self.cwd = Path(words[1])
                self.cwd.mkdir(parents=True, exist_ok=True)
                continue
            words = [self.filled(w) for w in words]
            one = Command(command.line, command.source, words, command.env)
            program = one.program
            args = words[3:] if words[0].startswith("python") and program == "vit-train" else words[1:]
            if expected:
                for refusal, write in REFUSED_INPUTS.items():
                    found = re.search(refusal, expected)
                    if found:
                        write(Path(mapped(found.group(1), self.tmp)), *found.groups()[1:])
            if program == "vit-train":
                data = composed_data(args)
                shapes = data is not None and data.get("name") == "shapes"
            if program == "vit-train" and re.search(r"#\s*a second time", command.source):
                self.check(one, *self.train(args, tiny(args, shapes=shapes)), None)  # the first time
            if program == "vit-train":
                status, out, err = self.train(args, tiny(args, replace=expected is None, size=True, shapes=shapes),
                                              expected)
            elif program in IN_PROCESS:
                if expected is None:
                    self.put_in(program, args)
                status, out, err = self.in_process(program, args)
                if program == "vit-export" and status == 0 and option(args, "format") == "safetensors" and \
                        _has_onnx():  # the other format the page names
                    status, out, err = self.in_process(program, [a for a in args if not a.startswith(("format=",
                                                                                                         "out="))]
                                                       + ["format=onnx"])
                    program += " (and format=onnx)"
            elif program == "torchrun":
                status, out, err = self.torchrun(words, one.env)
            elif program.startswith("script "):
                name = program.split()[1]
                script_args = tiny_script(name, words[2:])
                status, out, err = self.subprocess([sys.executable, str(ROOT / "scripts" / name), *script_args],
                                                   one.env)
            elif program == "pytest":
                status, out, err = self.subprocess([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                                                    *[str(ROOT / w) if w.startswith("tests/") else w
                                                      for w in words[1:]]], one.env)
            else:
                raise AssertionError(f"{program} cannot run here: {why_not_here(one)}")
            self.check(one, status, out, err, expected, program)

    def filled(self, word: str) -> str:
        """`word` with a run the page leaves to the reader (outputs/<date>/<time>/...) as the block's newest run (a
        tiny one of the quick start where the block made none)."""
        key, _, value = word.partition("=")
        if key not in PATH_KEYS or not re.search(r"<[\w-]+>", value):
            return word
        run = self.made[-1] if self.made else self.tiny_run("ckpt", [])
        parts = Path(value).parts
        last = max(k for k, part in enumerate(parts) if re.search(r"<[\w-]+>", part))
        return f"{key}={Path(run, *parts[last + 1:])}"

    def check(self, command: Command, status: int, out: str, err: str, expected: str | None,
              program: str = "") -> None:
        where = f"{command.line}: {' '.join(command.argv)}"
        if expected is None:
            assert status == 0, (where, out[-2000:], err[-3000:])
            self.ran.append(f"line {command.line}: {program or command.program}")
            return
        said = err.replace(str(self.tmp), "").strip().splitlines()
        assert status == 2 and said, (where, status, out[-2000:], err[-3000:])
        assert re.fullmatch(".*".join(map(re.escape, expected.split("..."))), said[-1]), (where, said[-1], expected)
        self.ran.append(f"line {command.line}: {command.program}, refused as shown")

    def train(self, args: list[str], run_args: list[str], expected: str | None = None) -> tuple[int, str, str]:
        if expected is None:
            self.put_in("vit-train", args)
            if option(args, "resume") not in (None, "auto", "null"):  # its own config: longer, on the CPU
                run_args = [a for a in args if not a.startswith("trainer.max_steps=")] + \
                    ["trainer.max_steps=4", "trainer.device=cpu", "trainer.progress=false"]
        before = set(self.runs_here())
        storage = option(args, "hydra.sweeper.storage")
        if storage:
            optuna_storage_opens(storage)
        self.next_second()
        with self.extending(run_args) as searched:
            found = self.in_process("vit-train", searched or run_args)
        self.made += sorted(set(self.runs_here()) - before, key=lambda p: p.stat().st_mtime)
        new = sorted({p.parent for p in self.cwd.glob("outputs/multirun/*/*/multirun.yaml")} - set(self.sweeps),
                     key=lambda p: p.stat().st_mtime)
        if found[0] == 0 and new:  # a sweep ends with its summary (Hydra turns a failing callback into a warning)
            assert (new[-1] / "summary.csv").is_file() and f"sweep {new[-1].relative_to(self.cwd)}" in found[1], \
                (new[-1], found[1][-2000:], found[2][-2000:])
        self.sweeps += new
        return found

    def extending(self, args: list[str]):
        """docs/extending.md's options of your own registered (tests/helpers/toy_options.py) where a command
        points hydra.searchpath at them: the arguments with the folder of their YAML files instead."""
        import contextlib

        @contextlib.contextmanager
        def options():
            if not any(a.startswith("hydra.searchpath=") for a in args):
                yield None
                return
            from helpers.registry import registry_kept
            from vit_train.cli.train import register_options

            import importlib
            with registry_kept():
                try:
                    importlib.import_module("helpers.toy_options")
                    register_options()
                    folder = self.tmp / "my_configs"
                    for group, name in (("data", "stripes"), ("objective", "hinge"), ("callbacks", "best_so_far")):
                        (folder / group).mkdir(parents=True, exist_ok=True)
                        (folder / group / f"{name}.yaml").write_text(f"defaults:\n  - /schema/{group}/{name}\n"
                                                                     f"  - _self_\n")
                    yield [f"hydra.searchpath=[file://{folder}]" if a.startswith("hydra.searchpath=") else a
                           for a in args]
                finally:
                    sys.modules.pop("helpers.toy_options", None)

        return options()

    def torchrun(self, words: list[str], env: dict[str, str]) -> tuple[int, str, str]:
        at = words.index("vit_train")
        launcher = [w for w in words[1:at - 1]]
        data = composed_data(words[at + 1:])
        args = tiny(words[at + 1:], shapes=data is not None and data.get("name") == "shapes")
        self.put_in("vit-train", args)
        torchrun = str(Path(sys.executable).with_name("torchrun"))
        self.next_second()
        return self.subprocess([torchrun, *launcher, "-m", "vit_train", *args], dict(env, OMP_NUM_THREADS="1"))

    def runs_here(self) -> list[Path]:
        return [p.parent.parent for p in self.tmp.glob("**/checkpoints/last.pt") if "cache" not in p.parts]

    # ------------------------------------------------ what the page assumes

    def put_in(self, program: str, args: list[str]) -> None:
        """The data, runs, checkpoints and images `program ARGS` reads that no earlier command made."""
        for key in PATH_KEYS:
            value = option(args, key)
            if value not in (None, "auto", "null") and not Path(self.cwd, value).exists():
                self.place_run(Path(self.cwd, value), key, args)
        if program in ("vit-train", "vit-shards"):
            self.place_data(args, program)
        if program == "vit-predict":
            for image in images_of(option(args, "images", "[]")):
                path = Path(self.cwd, image)
                if not path.exists():
                    write_picture(path)
        if program == "vit-sweep-summary":
            where = Path(self.cwd, args[0])
            if not where.exists():
                if not self.sweeps:
                    self.train(["-m", "optim.lr=1e-3,5e-4"], tiny(["-m", "optim.lr=1e-3,5e-4", "data=shapes"]))
                shutil.copytree(self.sweeps[-1], where)

    def place_run(self, path: Path, key: str, args: list[str]) -> None:
        """A run at `path` (a run directory, checkpoints/NAME.pt in one, a .pt, .ckpt or .safetensors file): the
        block's newest, else a tiny run of the command's own model and data (the quick start's for a tool)."""
        named_run = key in ("resume", "ckpt") or re.search(r"RUN|PATH|TEACHER|outputs/", str(path))
        run = self.made[-1] if self.made and named_run else self.tiny_run(key, args)
        if path.suffix == "" or (path.suffix == ".pt" and path.parent.name == "checkpoints"):
            folder = path if path.suffix == "" else path.parent.parent
            shutil.copytree(run, folder, dirs_exist_ok=True)
            if not path.exists() and path.suffix == ".pt":
                shutil.copy(folder / "checkpoints" / "last.pt", path)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".pt":
            shutil.copy(run / "checkpoints" / "best.pt", path)
        elif path.suffix == ".ckpt":  # Lightning's layout: {"state_dict": ...}
            import torch

            state = torch.load(run / "checkpoints" / "best.pt", weights_only=True, map_location="cpu")
            torch.save({"state_dict": state["model"], "epoch": 9, "global_step": 990}, path)
        elif path.suffix == ".safetensors":
            status, out, err = self.in_process("vit-export", [f"ckpt={run}/checkpoints/best.pt",
                                                              "format=safetensors", f"out={path}"])
            assert status == 0, err
        else:
            raise AssertionError(f"no way to put in {path}")

    def tiny_run(self, key: str, args: list[str]) -> Path:
        """A tiny run of the model and data of `args` (the defaults' where they name none; a tool's: the quick
        start's), trained once a session."""
        own = [a for a in args if a.split("=", 1)[0] in ("model", "data", "experiment") or
               (a.startswith(("model.", "data.")) and a.split("=", 1)[0] not in
                ("model.pretrained", "model.reset_head", "model.trainable", "model.distilled"))]
        if key == "ckpt":
            own = ["experiment=quickstart"]
        name = " ".join(own)
        if name not in self.cache:
            folder = self.cache["root"] / f"run{len(self.cache)}"
            self.place_data(own, "vit-train")
            data = composed_data(own)
            status, out, err = self.in_process("vit-train", [*tiny(own, size=True, shapes=data is not None and
                                                                   data.get("name") == "shapes"),
                                                              f"hydra.run.dir={folder}"])
            assert status == 0, (own, err[-3000:])
            self.cache[name] = folder
        return self.cache[name]

    def place_data(self, args: list[str], program: str) -> None:
        """The data set `args` read, where they read it, when it is not there: tiny, of the documented kind."""
        data = composed_data(args) if program == "vit-train" else {
            "name": option(args, "data", "shapes"), "root": option(args, "data.root")}
        if data is None or data.get("name") not in ON_DISK:
            return
        root = Path(self.cwd, data.get("root") or "data")
        if data["name"].startswith("cifar"):
            folder = "cifar-10-batches-py" if data["name"] == "cifar10" else "cifar-100-python"
            if not (root / folder).exists() and not (root / "data_batch_1").exists() and \
                    not (root / "train").exists():
                write_cifar(root, data["name"])
        elif not root.exists():
            if data["name"] == "imagefolder":
                from helpers.images import write_noisy_colours

                write_noisy_colours(root)
            elif data["name"] == "hf":
                write_hf(root, data.get("image_key") or "image", data.get("label_key") or "label",
                         data.get("train_split") or "train", data.get("val_split") or "validation")
            else:  # webdataset: written by vit-shards from an image folder
                from helpers.images import write_noisy_colours

                images = write_noisy_colours(self.tmp / "for_shards" / root.name)
                status, out, err = self.in_process("vit-shards", ["data=imagefolder", f"data.root={images}",
                                                                  f"out={root}"])
                assert status == 0, err


def write_classes_apart(root: Path, lacking: str) -> None:
    """An image folder whose val/ lacks one class of train/."""
    from helpers.images import write_image_folder

    write_image_folder(root, {"train": 2}, classes=("cat", lacking))
    write_image_folder(root, {"val": 2}, classes=("cat",))


# The input a refusal shown in a page is about, put in where the refusal's path points: (its pattern, groups: the
# path and what the writer takes) -> the writer.
REFUSED_INPUTS = {
    r"the class folders of (\S+)/train and \S+/val differ: val/ lacks '(\w+)'": write_classes_apart,
}


def _has_onnx() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) for m in ("onnx", "onnxscript"))


def composed_data(args: list[str]) -> dict | None:
    """The data section `vit-train ARGS` composes (its experiment, data group and data keys), or None when it
    does not compose so (the command then says why)."""
    from helpers.configs import composed

    own = [a for a in args if a.split("=", 1)[0] in ("experiment", "data") or a.startswith("data.")]
    try:
        return composed(own)["data"]
    except Exception:  # an option of docs/extending.md's own, a sweep, ...
        return None


def images_of(value: str) -> list[str]:
    """The file names of an `images=[...]` value."""
    from vit_train.cli.arguments import parse_override

    _, parsed = parse_override(f"images={value}")
    return [str(p) for p in (parsed if isinstance(parsed, list) else [parsed])]


def write_picture(path: Path) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (24, 20), (200, 40, 40)).save(path, format={".jpg": "JPEG", ".jpeg": "JPEG"}.get(
        path.suffix.lower(), path.suffix.lstrip(".").upper() or "PNG"))


def write_cifar(root: Path, name: str) -> None:
    """A tiny CIFAR-10 or CIFAR-100 in its own python format under `root`."""
    import pickle

    import numpy as np

    from helpers.images import write_cifar10

    if name == "cifar10":
        write_cifar10(root, per_batch=8)
        return
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 64), ("test", 16)):
        with open(folder / split, "wb") as f:
            pickle.dump({"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                         "fine_labels": rng.integers(0, 100, n).tolist(), "coarse_labels": [0] * n}, f)
    with open(folder / "meta", "wb") as f:
        pickle.dump({"fine_label_names": [f"c{i}" for i in range(100)], "coarse_label_names": []}, f)


def write_hf(root: Path, image_key: str, label_key: str, train: str, val: str) -> None:
    """A data=hf set saved with `save_to_disk`, with the columns and splits a command names."""
    import datasets

    from helpers.hf_sets import png

    features = datasets.Features({image_key: datasets.Image(), label_key: datasets.ClassLabel(names=["a", "b", "c"])})
    splits = {split: datasets.Dataset.from_dict({image_key: [{"bytes": png(i), "path": None} for i in range(n)],
                                                 label_key: [i % 3 for i in range(n)]}, features=features)
              for split, n in ((train, 24), (val, 9))}
    datasets.DatasetDict(splits).save_to_disk(str(root))


def optuna_storage_opens(url: str) -> None:
    """Nothing when Optuna opens the storage `url` (in the current folder); else an expected failure naming why."""
    import importlib.metadata as metadata

    import optuna

    try:
        optuna.storages.RDBStorage(url)
    except Exception as e:  # whatever Optuna's storage raises, named in the reason
        versions = ", ".join(f"{p} {metadata.version(p)}" for p in ("optuna", "SQLAlchemy", "alembic"))
        pytest.xfail(f"Optuna cannot open {url} here ({versions}): {type(e).__name__}: {e}")


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory):
    """The tiny runs made for what pages assume (a model's run, the quick start's), shared by every block."""
    return {"root": tmp_path_factory.mktemp("cache")}


@pytest.fixture
def no_download(monkeypatch):
    from vit_train.data.sources import cifar

    def refuse(*args, **kwargs):
        raise AssertionError("a test never downloads: the data should have been put in")

    monkeypatch.setattr(cifar, "_download", refuse)


@pytest.mark.slow
@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in BLOCKS])
def test_doc_block_runs(block: Block, tmp_path, monkeypatch, capsys, tiny_runs, no_download):
    """Each block's commands, in order, in one folder: each exits 0, or 2 with the refusal shown under it."""
    if block.needs:
        pytest.skip(f"needs {block.needs}")
    if block.run_by:
        pytest.skip(f"run as shown by {'::'.join(block.run_by)}")
    runner = Runner(tmp_path, monkeypatch, capsys, tiny_runs)
    for command in block.commands:
        runner.run(command)
    with capsys.disabled():
        print(f"\n{block.id}: ran {len(runner.ran)}: {'; '.join(runner.ran)}")
