"""MAE where it is meant to help: many unlabelled images, few labelled ones (docs/mae.md, "Does it help?").

For each seed of --seeds, `vit-train` runs, each printed before it starts, with the quick start's micro ViT
(mean pooling, fixed 2-D sin-cos positions):

1. pretrain: MAE pre-training on the unlabelled images (no labels read);
2. probe: a linear probe of that encoder (model.trainable=head optim.weight_decay=0, docs/finetuning.md);
3. finetune: fine-tuning that encoder (model.pretrained=<run 1>);
4. lp_ft: LP-FT from that encoder, the head alone for --lp-epochs, then --finetune-epochs of the whole network
   (model.lp_epochs);
5. recipe (only with --recipe): the few-label recipe from that encoder. With `experiment=NAME` among its words
   the recipe's own training keys hold: the run gets only the data, the labelled images, the seed, the model's
   shape and the encoder before the words. Without one, the words are added to the fine-tune's command;
6. recipe_scratch (only with --recipe): the recipe's command without the encoder, from a random initialisation
   (the recipe's margin over scratch is over this row: the same schedule and epochs);
7. scratch: the fine-tune's command from a random initialisation.

Runs 2-7 train on the same --labelled images and are scored on the same val images. On the built-in shapes the
labelled images are a separate draw of the generator (its images depend on data.seed and data.train_size), so
none of them was among the pre-training images; each seed draws its own images (data.seed=seed). With
--folder DIR (DIR/train/<class>/*, DIR/val/<class>/*), the pre-training trains on every image of DIR/train without
labels (its val reconstruction loss on DIR/val), and the labelled runs read a per-class balanced subset of
--labelled images of DIR/train, drawn with the seed: data=imagefolder reads whole folders (it takes no subset), so
the script links the chosen images (symbolic links) under --out/seed_<S>/labelled/train/, with val/ a link to
DIR/val, and records the choice.

Prints, and writes to --out/table.md, one Markdown table: a row per run, its top-1 (%) at the end of each seed's run
(final_top1 of results.json: the last evaluation, no choice made on the val images), their mean and spread (max -
min), each row's margin over the probe and over scratch per seed (points), and the wall seconds; then the load
average, torch version, machine and git commit. --out/table.json holds the table and every number: each run's
command, results.json and seconds.

    python scripts/mae_demo.py                       # 3 seeds: about an hour on 2 CPU cores (docs/mae.md's runs)
    python scripts/mae_demo.py --seeds 0 --labelled 1000 --recipe "optim.layer_decay=0.75 model.drop_path=0.1"
    python scripts/mae_demo.py --folder /data/pets --labelled 200 --img-size 64 --patch-size 8
    python scripts/mae_demo.py --smoke               # tiny sizes, a few steps each: about 2 minutes
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's vit_train, as the runs get (`run`)
MODEL = ["model.pool=mean", "model.pos_embed=sincos2d"]  # as the quick start (configs/experiment/quickstart.yaml)
PROBE = ["model.trainable=head", "optim.weight_decay=0"]  # a linear probe as docs/finetuning.md runs it
# the probe's lr (and LP-FT's first stage's, model.lp_lr): of 2e-3 (the fine-tune's), 2e-2 and 1e-1, the best probe on
# seed 0's encoder (22.0, 31.7, 35.9 top-1); a probe learns at a higher rate than a fine-tune (MAE: 0.1 x batch / 256)
PROBE_LR = 1e-1
# keys the script sets on every labelled row: a recipe that set one would change the rows' encoder or images silently
SCRIPT_KEYS = ("model.pretrained", "seed", "data.seed", "data.root", "data.train_size", "data.val_size", "data")
TITLES = {
    "pretrain": "MAE pre-training",
    "probe": "linear probe of the MAE encoder",
    "finetune": "fine-tuned from the MAE encoder",
    "lp_ft": "LP-FT from the MAE encoder",
    "recipe": "the recipe from the MAE encoder",
    "recipe_scratch": "the recipe from scratch",
    "scratch": "from scratch",
}
# sizes: the full run, and --smoke's (a few steps each); a size given on the command line wins
FULL = {"unlabelled": 10000, "labelled": 500, "pretrain_epochs": 10, "finetune_epochs": 40, "lp_epochs": 10,
        "val_size": 2000, "pretrain_val_size": 500, "seeds": "0,1,2"}
SMOKE = {"unlabelled": 256, "labelled": 40, "pretrain_epochs": 1, "finetune_epochs": 2, "lp_epochs": 1,
         "val_size": 100, "pretrain_val_size": 64, "seeds": "0"}
# the row each row's "over scratch" subtracts: the recipe's is its own command from a random initialisation
SCRATCH_OF = {"recipe": "recipe_scratch"}
SMOKE_RECIPE_STEPS = 2  # --smoke caps a recipe's run of the fine-tune's command at this many steps (fit_recipe: one
# with its own experiment runs two epochs)


class Refused(Exception):
    """Bad input to the script: one line, exit status 2."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/mae_few_labels", help="folder for the runs and the table")
    parser.add_argument("--folder", help="an image folder of your own: DIR/train/<class>/*, DIR/val/<class>/*")
    parser.add_argument("--unlabelled", type=int, help="shapes: pre-training images (no labels); 10000")
    parser.add_argument("--labelled", type=int, help="labelled images of the probe and fine-tuning runs; 500")
    parser.add_argument("--seeds", help="comma-separated seeds, each its own pre-training and rows; 0,1,2")
    parser.add_argument("--pretrain-epochs", type=int, help="10")
    parser.add_argument("--finetune-epochs", type=int, help="40 (the probe's, the fine-tune's, LP-FT's second stage)")
    parser.add_argument("--lp-epochs", type=int, help="LP-FT's first stage, the head alone; 10")
    parser.add_argument("--probe-lr", type=float, default=PROBE_LR,
                        help=f"the probe's lr and LP-FT's first stage's (model.lp_lr); {PROBE_LR:g}")
    parser.add_argument("--pretrained-from", metavar="OUT",
                        help="an earlier --out of this script: each seed's pre-training read from OUT/seed_<S>/pretrain "
                             "(its command must be the one this run would give), not run again")
    parser.add_argument("--recipe", help="the few-label recipe's words, e.g. 'experiment=<a recipe>' "
                                         "or 'optim.layer_decay=0.75 model.drop_path=0.1'")
    parser.add_argument("--img-size", type=int, help="model.img_size (default: the data set's, 32 or 224)")
    parser.add_argument("--patch-size", type=int, help="model.patch_size (default: the data set's, 4 or 16)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: a few steps each, every row")
    args = parser.parse_args()
    if args.folder and args.unlabelled is not None:
        parser.error("--unlabelled counts shapes images; with --folder the pre-training reads every image of DIR")
    for key, value in (SMOKE if args.smoke else FULL).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds takes comma-separated integers, e.g. 0,1,2; got {args.seeds!r}")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds names a seed twice: {args.seeds}")
    for key in ("labelled", "pretrain_epochs", "finetune_epochs", "lp_epochs", *(() if args.folder else ("unlabelled",))):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be at least 1, got {getattr(args, key)}")
    args.recipe = shlex.split(args.recipe) if args.recipe else None
    for word in args.recipe or []:
        key = word.split("=", 1)[0].lstrip("+~")
        if key in SCRIPT_KEYS or key.startswith("hydra."):
            parser.error(f"--recipe sets {key}, which the script gives each row (the encoder, the labelled and val "
                         f"images, the seed, the run directory): drop it from --recipe")
    if not 1e-5 <= args.probe_lr < math.inf:
        parser.error(f"--probe-lr must be a finite number of at least 1e-05 (the runs' schedule.min_lr), got "
                     f"{args.probe_lr:g}")
    if args.folder:  # the folder's own val images; the pre-training's count is the folder's (main)
        args.val_size = args.pretrain_val_size = None
    return args


def choose_labelled(folder: Path, count: int, seed: int, dest: Path) -> dict:
    """Link `count` images of folder/train, balanced over its classes and drawn with `seed`, under dest/train/ (same
    relative paths), and dest/val to folder/val. Each class gets count // classes images, and the count % classes
    classes drawn first one more. Images and classes are listed as data=imagefolder lists them. Returns the record:
    the seed, the count per class and the chosen paths relative to folder/train. Raises Refused for a folder
    vit-train would refuse or with too few images."""
    from vit_train.data.sources.imagefolder_files import load_image_folders
    from vit_train.errors import UserError

    try:
        train, _, classes = load_image_folders(folder)
    except UserError as e:
        raise Refused(f"--folder {folder}: {e}") from None
    if count < len(classes):
        raise Refused(f"--labelled {count} is below the {len(classes)} classes of {folder / 'train'}: a labelled "
                      f"run needs an image of every class; give --labelled {len(classes)} or more")
    rng = random.Random(seed)
    extra = set(rng.sample(classes, count % len(classes)))
    per_class, chosen = {}, []
    for index, name in enumerate(classes):
        files = sorted(os.path.relpath(path, folder / "train") for path, label in train.samples if label == index)
        want = count // len(classes) + (name in extra)
        if len(files) < want:
            raise Refused(f"--labelled {count} takes {want} images of class {name!r}, which has {len(files)} in "
                          f"{folder / 'train'}; give a smaller --labelled")
        per_class[name] = want
        chosen += sorted(rng.sample(files, want))
    for relative in chosen:
        link = dest / "train" / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(folder.resolve() / "train" / relative)
    (dest / "val").symlink_to(folder.resolve() / "val", target_is_directory=True)
    return {"seed": seed, "folder": str(dest), "per_class": per_class, "images": chosen}


def unlabelled_images(folder: Path) -> int:
    """How many images MAE pre-training reads from folder/train (data=imagefolder without labels: any depth).
    Raises Refused for a folder vit-train would refuse."""
    from vit_train.data.sources.imagefolder_files import load_unlabelled_folders
    from vit_train.errors import UserError

    try:
        return len(load_unlabelled_folders(folder)[0])
    except UserError as e:
        raise Refused(f"--folder {folder}: {e}") from None


def commands(args: argparse.Namespace, seed: int, out: Path, labelled_root: Path | None,
             pretrain: Path | None = None) -> dict[str, list[str]]:
    """Each run's vit-train arguments, by name, in the order they run; hydra.run.dir=out/<name> last. The encoder the
    labelled rows read is `pretrain` when given (--pretrained-from), else out/pretrain."""
    shape = [f"model.{key}={value}" for key, value in (("img_size", args.img_size), ("patch_size", args.patch_size))
             if value is not None]
    common = [*MODEL, *shape, f"seed={seed}", "trainer.progress=false"]
    if args.folder:
        unlabelled = ["data=imagefolder", *common, f"data.root={args.folder}"]
        labelled = ["data=imagefolder", *common, f"data.root={labelled_root}"]
    else:
        shapes = ["data=shapes", f"data.seed={seed}", *common]
        unlabelled = [*shapes, f"data.train_size={args.unlabelled}", f"data.val_size={args.pretrain_val_size}"]
        labelled = [*shapes, f"data.train_size={args.labelled}", f"data.val_size={args.val_size}"]
    batch = min(64, args.labelled)
    training = [f"data.batch_size={batch}", "schedule.warmup_epochs=1", f"trainer.eval_every={-(-args.labelled // batch) * 5}"]
    finetune = [*labelled, *training, "optim.lr=2e-3", f"trainer.epochs={args.finetune_epochs}"]
    probe = [*labelled, *training, f"optim.lr={args.probe_lr!r}", f"trainer.epochs={args.finetune_epochs}"]
    encoder = f"model.pretrained={pretrain or out / 'pretrain'}"
    plan = {
        "pretrain": ["objective=mae", *unlabelled, f"data.batch_size={min(64, args.unlabelled)}", "optim.lr=2e-3",
                     f"trainer.epochs={args.pretrain_epochs}", "schedule.warmup_epochs=0.5"],
        "probe": [*probe, encoder, *PROBE],
        "finetune": [*finetune, encoder],
        "lp_ft": [*labelled, *training, "optim.lr=2e-3", f"trainer.epochs={args.lp_epochs + args.finetune_epochs}", encoder,
                  f"model.lp_epochs={args.lp_epochs}", f"model.lp_lr={args.probe_lr!r}"],
    }
    if args.recipe:
        own = any(word.startswith("experiment=") for word in args.recipe)
        words = [*(labelled if own else finetune), encoder, *args.recipe]
        if own:  # the recipe's own batch and epochs, fitted to the labelled images (and to --smoke)
            words += fit_recipe(args, words)
        elif args.smoke:
            words.append(f"trainer.max_steps={SMOKE_RECIPE_STEPS}")
        plan["recipe"] = words
        plan["recipe_scratch"] = [word for word in plan["recipe"] if word != encoder]
    plan["scratch"] = finetune
    return {name: [*argv, f"hydra.run.dir={out / name}"] for name, argv in plan.items()}


def fit_recipe(args: argparse.Namespace, words: list[str]) -> list[str]:
    """The words a recipe with its own experiment gets after its own: data.batch_size=<--labelled> where the
    recipe's batch is larger than the labelled images (a batch cannot hold more images than the training set), and
    with --smoke two epochs, one of them LP-FT's head alone where the recipe has that stage (both stages run).
    Raises Refused when the words do not compose (the composer's own message)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from vit_train.cli.train import _config_dir  # also registers the schema node train.yaml lists first

    try:
        with initialize_config_dir(config_dir=str(_config_dir()), version_base="1.3"):
            cfg = OmegaConf.to_container(compose("train", overrides=[w for w in words if not w.startswith("hydra.")]))
    except Exception as e:  # Hydra's and OmegaConf's errors: an unknown recipe, key or value
        raise Refused(f"--recipe {shlex.join(args.recipe or [])}: {str(e).splitlines()[0]}") from None
    assert isinstance(cfg, dict)
    extra = [f"data.batch_size={args.labelled}"] if cfg["data"]["batch_size"] > args.labelled else []
    if args.smoke:
        extra += ["trainer.epochs=2", *(["model.lp_epochs=1"] if cfg["model"].get("lp_epochs") else [])]
    return extra


def earlier_pretrain(earlier: Path, seed: int, argv: list[str]) -> dict:
    """--pretrained-from: seed `seed`'s pre-training in `earlier` (its command, results.json and seconds, and
    `read_from`): as earlier/table.json records it, or, where the earlier script stopped before writing one, as
    its run directory holds it (Hydra's .hydra/overrides.yaml, results.json; the seconds its results.json gives).
    Raises Refused where that run is missing or was not completed, or its command differs from `argv` (this run's,
    hydra.run.dir aside): an encoder of other images or sizes would be compared silently."""
    here = earlier / f"seed_{seed}" / "pretrain"
    try:
        record = json.loads((earlier / "table.json").read_text())["runs"][str(seed)]["pretrain"]
    except (OSError, ValueError, KeyError, TypeError):
        record = run_directory(here)
    if record is None:
        raise Refused(f"--pretrained-from {earlier}: no pre-training of seed {seed} there ({here} holds no run that "
                      f"mae_demo.py started); give the --out of an earlier run with seed {seed}")
    given, wanted = record["command"][1:-1], argv[:-1]
    if given != wanted:
        then, now = (dict(w.split("=", 1) for w in words if "=" in w) for words in (given, wanted))
        differ = sorted(k for k in then.keys() | now.keys() if then.get(k) != now.get(k))
        raise Refused(f"--pretrained-from {earlier}: seed {seed}'s pre-training ran with "
                      f"{', '.join(f'{k}={then[k]}' if k in then else f'no {k}' for k in differ)}, where this run "
                      f"gives {', '.join(f'{k}={now[k]}' if k in now else f'no {k}' for k in differ)}; give the "
                      f"options that run had (--smoke, --unlabelled, --pretrain-epochs, --folder, --img-size, "
                      f"--patch-size), or drop --pretrained-from")
    if record["results"].get("status") != "completed":
        raise Refused(f"--pretrained-from {earlier}: seed {seed}'s pre-training did not complete "
                      f"(status {record['results'].get('status')}); run it again")
    here = Path(record.get("read_from") or here)  # an earlier --pretrained-from's: the run it read
    saved = saved_differences(here, given, record["results"])
    if saved:
        raise Refused(f"--pretrained-from {earlier}: seed {seed}'s pre-training in {here} changed after it ran "
                      f"({saved}); the table would show another encoder's numbers: run it again, or give an "
                      f"--out whose pre-training is as it ran")
    return {**record, "read_from": str(here)}


def saved_differences(run_dir: Path, words: list[str], results: dict) -> str:
    """How the weights a labelled row would load (run_dir's checkpoints/best.pt, what model.pretrained=<run_dir>
    reads) differ from the run `words` and `results` describe: another step than results' best_step, or a saved
    config key other than a word's (a group's word, e.g. objective=mae, is its section's name); "" where none."""
    import yaml

    from vit_train.checkpoint.files import read_archive

    try:
        ckpt = read_archive(run_dir / "checkpoints" / "best.pt")
    except Exception as e:  # a missing or unreadable file: torch's and the OS's errors
        return f"its checkpoints/best.pt cannot be read: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    config, differ = ckpt.get("config") or {}, []
    for word in words:
        key, _, text = word.partition("=")
        value: object = config
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, dict):  # a group's word names its option
            value = value.get("name")
        wanted = yaml.safe_load(text)
        if isinstance(wanted, str):  # YAML 1.1 reads 2e-3 as a string; the command line's parser, as a number
            try:
                wanted = float(wanted)
            except ValueError:
                pass
        if value != wanted:
            differ.append(f"{key}={value} in the checkpoint, {text} in the command")
    if results.get("best_step") is not None and ckpt.get("step") != results["best_step"]:
        differ.append(f"best.pt is at step {ckpt.get('step')}, the results' best at step {results['best_step']}")
    return "; ".join(differ)


def run_directory(run_dir: Path) -> dict | None:
    """A run's command, results.json and seconds as its directory holds them (Hydra's .hydra/overrides.yaml: the
    command line's words, hydra.* aside, so hydra.run.dir=run_dir is added; results.json's
    wall_seconds_all_attempts); None without both files."""
    import yaml

    try:
        words = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
        results = json.loads((run_dir / "results.json").read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None
    if not isinstance(words, list) or not isinstance(results, dict):
        return None
    return {"command": ["vit-train", *map(str, words), f"hydra.run.dir={run_dir}"], "results": results,
            "seconds": results.get("wall_seconds_all_attempts") or 0.0}


def run(name: str, args: list[str], seed: int) -> dict:
    """Run `vit-train ARGS` (this checkout's, with this Python), printing the command first; its command,
    results.json and wall seconds. Raises CalledProcessError when it fails (it has printed why)."""
    print(f"$ {shlex.join(['vit-train', *args])}", flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    started = time.time()
    subprocess.run([sys.executable, "-m", "vit_train", *args], check=True, stdout=subprocess.DEVNULL, env=env)
    seconds = time.time() - started
    run_dir = Path(args[-1].split("=", 1)[1])
    results = json.loads((run_dir / "results.json").read_text())
    print(f"  {name} (seed {seed}): {seconds:.0f} s", flush=True)
    for warning in warnings_of(run_dir):
        print(f"  warning: {warning}", flush=True)
    return {"command": ["vit-train", *args], "results": results, "seconds": seconds}


def warnings_of(run_dir: Path) -> list[str]:
    """The run's warnings as its train.log has them, each once, in order (the script hides vit-train's output: a run
    at a size the images do not have, or whose LP-FT stage never ends, says so there)."""
    try:
        lines = (run_dir / "train.log").read_text(errors="replace").splitlines()
    except OSError:
        return []
    return list(dict.fromkeys(line.split("[WARNING] ", 1)[1] for line in lines if "[WARNING] " in line))


def rows(runs: dict[int, dict[str, dict]], seeds: list[int], labelled: int, unlabelled: str,
         titles: dict[str, str]) -> list[dict]:
    """The table's rows with their numbers: per seed the final top-1 (%) (the pre-training's final val
    reconstruction loss), their mean, min, max and spread (max - min), each row's margin over the probe and over
    scratch per seed (points; None for the reference row itself and the pre-training), and the wall seconds."""
    table = []
    for name in runs[seeds[0]]:
        metric = "final_loss" if name == "pretrain" else "final_top1"
        values = [runs[s][name]["results"][metric] for s in seeds]
        row = {"name": name, "title": titles[name], "labelled": 0 if name == "pretrain" else labelled,
               "unlabelled": unlabelled if name == "pretrain" else None, "metric": metric, "per_seed": values,
               "mean": statistics.fmean(values), "min": min(values), "max": max(values),
               "spread": max(values) - min(values), "seconds": [runs[s][name]["seconds"] for s in seeds]}
        for key, reference in (("probe", "probe"), ("scratch", SCRATCH_OF.get(name, "scratch"))):
            mine = name not in ("pretrain", reference)
            row[f"over_{key}"] = [v - runs[s][reference]["results"][metric] for s, v in zip(seeds, values, strict=True)] \
                if mine else None
        table.append(row)
    return table


def markdown(table: list[dict], seeds: list[int], recipe: list[str] | None) -> str:
    """The rows as one Markdown table, numbers to 2 decimals (a loss to 4)."""
    head = ["run", "labelled images", *(f"seed {s}" for s in seeds), "mean", "spread (max-min)",
            "over the probe (per seed)", "over scratch (per seed)", "wall s (all seeds)"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for row in table:
        title = row["title"]
        if row["name"] == "pretrain":
            title += f" ({row['unlabelled']}; the cells: val reconstruction loss)"
        elif row["name"] in ("recipe", "recipe_scratch"):
            title += f" (`{shlex.join(recipe or [])}`)"
        number = "{:.4f}".format if row["name"] == "pretrain" else "{:.2f}".format
        margins = [", ".join(f"{m:+.2f}" for m in row[key]) if row[key] is not None else ""
                   for key in ("over_probe", "over_scratch")]
        cells = [title, str(row["labelled"]), *map(number, row["per_seed"]), number(row["mean"]),
                 number(row["spread"]), *margins, f"{sum(row['seconds']):.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def epochs(count: int) -> str:
    return f"{count} epoch{'' if count == 1 else 's'}"


def git_commit() -> str:
    """This checkout's commit (short), "+ changes" when the tree differs from it; "unknown" outside git."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit} + changes" if changed else commit


def machine() -> str:
    """The CPU's model name (/proc/cpuinfo, else platform.processor()) and the CPU count."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} CPUs"


def main() -> int:
    args = parse_args()
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        print(f"mae_demo.py: error: {out} is not empty: give another --out, or remove it", file=sys.stderr)
        return 2
    load_start, started = os.getloadavg(), time.time()
    runs: dict[int, dict[str, dict]] = {}
    choices: dict[int, dict] = {}
    try:
        if args.folder:
            args.unlabelled = unlabelled_images(Path(args.folder))
        earlier = Path(args.pretrained_from) if args.pretrained_from else None
        # every seed's earlier pre-training read and checked before any run
        reused = {seed: earlier_pretrain(earlier, seed, commands(args, seed, out / f"seed_{seed}", None)["pretrain"])
                  for seed in args.seeds} if earlier else {}
        for seed in args.seeds:
            here = out / f"seed_{seed}"
            labelled_root = None
            if args.folder:
                labelled_root = here / "labelled"
                choices[seed] = choose_labelled(Path(args.folder), args.labelled, seed, labelled_root)
                print(f"seed {seed}: {args.labelled} labelled images of {Path(args.folder) / 'train'} "
                      f"({', '.join(f'{k} {n}' for k, n in choices[seed]['per_class'].items())}), linked under "
                      f"{labelled_root} (data=imagefolder reads whole folders); the list is in "
                      f"{out / 'table.json'}", flush=True)
            plan = commands(args, seed, here, labelled_root, Path(reused[seed]["read_from"]) if earlier else None)
            runs[seed] = {}
            for name, argv in plan.items():
                if name == "pretrain" and seed in reused:
                    runs[seed][name] = reused[seed]
                    print(f"$ (pretrain, seed {seed}: read from {reused[seed]['read_from']}, "
                          f"{reused[seed]['seconds']:.0f} s when it ran)", flush=True)
                else:
                    runs[seed][name] = run(name, argv, seed)
    except Refused as e:
        print(f"mae_demo.py: error: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"mae_demo.py: stopped: the vit-train run above ended with exit status {e.returncode} (it said why)",
              file=sys.stderr)
        return e.returncode if e.returncode == 2 else 1
    unlabelled = f"{args.unlabelled} unlabelled images" + (f" of {Path(args.folder) / 'train'}" if args.folder else "")
    titles = {**TITLES, "lp_ft": f"{TITLES['lp_ft']} (the head alone {epochs(args.lp_epochs)}, then "
                                 f"{epochs(args.finetune_epochs)})"}
    table = rows(runs, args.seeds, args.labelled, unlabelled, titles)
    text = markdown(table, args.seeds, args.recipe)
    load_end = os.getloadavg()
    import torch  # its version as the runs had it (a local build's suffix too, e.g. +cu130)

    environment = {"load_average_start": list(load_start), "load_average_end": list(load_end),
                   "torch": torch.__version__, "python": platform.python_version(),
                   "machine": machine(), "cpu_count": os.cpu_count(), "commit": git_commit(),
                   "wall_seconds": time.time() - started}
    notes = (f"top-1 (%): each run's final evaluation (results.json's final_top1) on the same val images within a "
             f"seed; over the probe / over scratch: the row's top-1 minus theirs, in points, seed by seed (the recipe's "
             f"over scratch: over the recipe from scratch, the same command without the encoder).\n"
             f"{environment['wall_seconds']:.0f} s wall in all; load average (1 min) {load_start[0]:.2f} at the start, "
             f"{load_end[0]:.2f} at the end; torch {environment['torch']}; {environment['machine']}; "
             f"commit {environment['commit']}")
    if args.pretrained_from:
        try:
            then = json.loads((Path(args.pretrained_from) / "table.json").read_text())["environment"]["commit"]
        except (OSError, ValueError, KeyError, TypeError):
            then = "unknown"
        notes += (f"; the pre-training runs read from {args.pretrained_from} (--pretrained-from; commit {then}), "
                  f"not run again: their wall s are those they took then, the wall in all excludes them")
    print(f"\n{text}\n\n{notes}")
    (out / "table.md").write_text(f"{text}\n\n{notes}\n")
    record = {"argv": sys.argv[1:], "setting": {k: v for k, v in vars(args).items()}, "environment": environment,
              "rows": table, "table": text, "labelled_images": {str(s): c for s, c in choices.items()} or None,
              "runs": {str(s): r for s, r in runs.items()}}
    (out / "table.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
