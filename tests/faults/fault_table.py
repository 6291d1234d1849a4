"""The fault table of docs/reliability.md: each fault injected as an adversary would, how often, how
many runs survived it, and the evidence. Prints a Markdown table (and writes it as JSON with --json).

    OMP_NUM_THREADS=1 python tests/faults/fault_table.py [--only kill,fs,sweep,bitflip,writers,diskfull,hostile]
                                                         [--json PATH]

"Survived" is judged against an uninterrupted reference run with the same seed (16 steps, every
step logged, evaluations at steps 4, 8, 12 and 16 with new bests at 4 and 12, checkpoints at steps 3,
4, 6, 8, 9, 12, 15 and 16, two kept): after the fault and `resume=auto`, every file a user reads is the
reference's (tests/helpers/files.py `assert_every_file_as_the_reference`): last.pt, best.pt and the
step files (names and every entry: weights, optimiser, scheduler, torch's RNG, step, best step),
results.json but for timings, metrics.jsonl row by row, every TensorBoard scalar tag, train.log's
closing line, no temporary file; for sweep faults every job's files, no refusal record and the
summary (summary.csv, summary.md) but for timing columns (`assert_same_sweep`). Each refusal must be
one line. The kills and pauses are real signals at chosen moments (tests/helpers/killer.py) or before
each file-system call of the checkpoint saves and results.json (tests/helpers/fs_killer.py, the
equivalent of `strace -e inject=...:signal=SIGKILL:when=N`), in a forked child; the full disks real
tmpfs mounts (tests/helpers/diskfull.py; needs `unshare`), the hostile files tests/outputs/test_hostile.py.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fault_kills import (SAVES, SECTIONS, TESTS, fs_rows, kill_rows, killer, resumed, row, same,  # noqa: E402
                         sweep_rows)
from helpers.configs import TINY, tiny_config  # noqa: E402

import torch  # noqa: E402

from vit_train.checkpoint import load_checkpoint  # noqa: E402
from vit_train.errors import UserError  # noqa: E402
from vit_train.sweeps.job import run_job  # noqa: E402
from vit_train.train.trainer import train  # noqa: E402

PAUSES = [(("row", 1), "command"), (("mid_write", 2), "train"), (("val_row", 1), "sweep job"), (("row", 7), "command"),
          (("tmp_done", 4), "train"), (("row", 14), "sweep job")]
TMPFS_KB = [4, 8, 12, 16, 32, 64, 128, 200, 290, 350, 450, 600, 900]


def flip(path: Path, offset: int, count: int = 16) -> None:
    data = bytearray(path.read_bytes())
    for i in range(offset, min(offset + count, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def bitflip_rows(work: Path, reference: Path) -> list[dict]:
    sound = reference / "checkpoints" / "last.pt"
    original, size = torch.load(sound, weights_only=True), sound.stat().st_size
    flat_original = torch.utils._pytree.tree_flatten({k: original[k] for k in ("model", "optimizer", "rng")})[0]
    outcomes, refused = [], 0
    for k in range(200):
        damaged = work / "flipped.pt"
        shutil.copyfile(sound, damaged)
        flip(damaged, k * (size - 16) // 199)
        try:
            got = load_checkpoint(damaged)
        except UserError as e:
            refused += 1
            outcomes.append(None if "\n" not in str(e) else "refusal of more than one line")
            continue
        except Exception as e:  # noqa: BLE001
            outcomes.append(f"{type(e).__name__} instead of a one-line refusal")
            continue
        flat = torch.utils._pytree.tree_flatten({k: got[k] for k in ("model", "optimizer", "rng")})[0]
        harmless = len(flat) == len(flat_original) and all(
            torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(flat, flat_original))
        outcomes.append(None if harmless else f"loaded changed tensors silently (offset {k * (size - 16) // 199})")
    in_run, passed_over = [], 0
    for k in range(6):
        run_dir = work / f"rot_{k}"
        shutil.copytree(reference, run_dir, ignore=shutil.ignore_patterns(".lock"))
        last, step_16 = run_dir / "checkpoints" / "last.pt", run_dir / "checkpoints" / "step_00000016.pt"
        step_16.unlink()
        os.link(last, step_16)  # one file, two names, as the run keeps them
        flip(last, last.stat().st_size * (k + 1) // 8)
        log = work / f"rot_{k}.log"
        handler = logging.FileHandler(log)
        logging.getLogger("vit_train").addHandler(handler)
        outcome = resumed(run_dir, reference)
        logging.getLogger("vit_train").removeHandler(handler)
        handler.close()
        text = log.read_text()
        passed_over += "last.pt is damaged" in text and bool(re.search(r"step_00000015\.pt at epoch \d+, step 15",
                                                                         text))
        in_run.append(outcome)  # equal to the reference: passed over, or bytes the reader ignores
    return [row(f"16 bytes flipped in a checkpoint, at 200 places from its first byte to its last, then loaded "
                f"({size} bytes)", outcomes, f"{refused} refused in one line (CRC-32 or zip structure), "
                f"{len(outcomes) - refused} loaded bit-identical tensors (bytes the reader ignores), none changed "
                f"silently"),
            row("16 bytes flipped in last.pt of a finished run (at 1/8 ... 6/8 of it), then `resume=auto`", in_run,
                f"equal to the reference; {passed_over} named the damage in one line and passed over last.pt (and "
                f"step_16.pt, the same file) to step_15.pt, {len(in_run) - passed_over} hit bytes the reader ignores "
                f"and resumed from last.pt as it was")]


def wait_stopped(pid: int) -> None:
    _, status = os.waitpid(pid, os.WUNTRACED)
    if not os.WIFSTOPPED(status):
        raise AssertionError(f"the first writer ended (wait status {status}) before its pause")


def files(run_dir: Path) -> dict:
    return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def second_writer(kind: str, run_dir: Path, holder: int) -> str | None:
    """None when the second writer is refused, in one line naming the holder, without touching run_dir."""
    if kind == "command":
        done = subprocess.run([sys.executable, "-m", "vit_train", *TINY, "seed=2", f"hydra.run.dir={run_dir}"],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 2 or done.stderr.count("\n") != 1 or f"(pid {holder} on " not in done.stderr:
            return f"second vit-train: status {done.returncode}: {done.stderr[-200:]}"
    elif kind == "train":
        try:
            train(tiny_config(**{**SECTIONS, "seed": 2}), run_dir)
            return "a second train() into the directory ran"
        except UserError as e:
            if f"(pid {holder} on " not in str(e) or "\n" in str(e):
                return f"refused without naming the holder: {e}"
    else:
        value = run_job(lambda: (tiny_config(**{**SECTIONS, "seed": 2}), [], None), run_dir, ["seed=2"], 0,
                        "best_top1")
        if not math.isnan(value):
            return "a sweep job ran in the directory"
    return None


def writer_rows(work: Path, reference: Path) -> list[dict]:
    outcomes = []
    for k, ((fault, n), kind) in enumerate(PAUSES):
        run_dir = work / f"writers_{k}"
        first = killer(run_dir, fault, n, stop=True)
        try:
            wait_stopped(first)
            before = files(run_dir)
            outcome = second_writer(kind, run_dir, first)
            if outcome is None and files(run_dir) != before:
                outcome = f"the second {kind} changed the directory"
        finally:
            os.kill(first, signal.SIGCONT)
        _, status = os.waitpid(first, 0)
        if outcome is None and status != 0:
            outcome = f"the first writer failed after its pause (wait status {status})"
        outcomes.append(outcome or same(run_dir, reference))
    return [row("a second writer into a run directory while the first is paused mid-run (" + ", ".join(
        f"{kind} at {fault} {n}" for (fault, n), kind in PAUSES) + ")", outcomes,
        "the second is refused in one line naming the first's pid (`vit-train` exit 2, `train()` RunDirBusy, a sweep "
        "job failed), not one byte of the directory changes, the first then ends equal to the reference")]


def tmpfs_available() -> list[str] | None:
    for args in (["unshare", "-m"], ["unshare", "-rm"]):
        if shutil.which("unshare") and subprocess.run([*args, "true"], capture_output=True).returncode == 0:
            return args
    return None


def diskfull_rows(work: Path, reference: Path) -> list[dict]:
    rows = []
    unshare = tmpfs_available()
    if unshare:
        outcomes, kinds, written = [], {}, 0
        for size in TMPFS_KB:
            out = work / f"tmpfs_{size}"
            out.mkdir()
            done = subprocess.run([*unshare, sys.executable, str(TESTS / "helpers" / "diskfull.py"), str(out), str(size),
                                   json.dumps(SECTIONS)], capture_output=True, text=True, timeout=600)
            if done.returncode != 0 or "Traceback" in done.stderr:
                outcomes.append(f"{size} kB: {done.stderr.strip()[-200:]}")
                continue
            report = json.loads((out / "report.json").read_text())
            first, results = report["first"], report["results_after_failure"]
            what = re.match(r"could not write .*?/run/([\w./]+):", first)
            kinds[size] = "completed" if first == "completed" else (what.group(1) if what else first[:60])
            if kinds[size] == "checkpoints/last.pt":
                kinds[size] = "the first checkpoint" if first.endswith("there is no earlier checkpoint") else \
                    "a later checkpoint"
            written += bool(results and results["status"] == "failed")
            if first != "completed" and (not what or "\n" in first or "no space left on" not in first):
                outcomes.append(f"{size} kB: {first[:200]}")
            elif any(name.endswith(".tmp") for name in report["checkpoints_after_failure"]):
                outcomes.append(f"{size} kB: a temporary file was left")
            elif results and first != "completed" and (results["status"], results.get("error")) != ("failed", first):
                outcomes.append(f"{size} kB: results.json says {results['status']}")
            else:
                outcomes.append(same(out / "run", reference))
        rows.append(row(f"a full disk: a real tmpfs of {', '.join(map(str, TMPFS_KB))} kB, then enlarged and "
                        f"`resume=auto`", outcomes,
                        f"one line naming what did not fit ({by_kind(kinds)}), no *.tmp; results.json `failed` "
                        f"with the line in the {written} runs where it still fitted; the resumed run equals the "
                        f"reference"))
    outcomes = []
    for n in range(1, SAVES + 1):
        run_dir = work / f"enospc_{n}"
        outcomes.append(enospc_at(run_dir, n) or resumed(run_dir, reference))
    rows.append(row(f"ENOSPC raised by the n-th checkpoint write, n = 1 ... {SAVES} (simulated in torch.save)",
                    outcomes,
                    "one line (`no space left on ...`, 'there is no earlier checkpoint' only for the first), "
                    "train.log and results.json (`failed`) carry it; `resume=auto` equals the reference"))
    return rows


def by_kind(kinds: dict[int, str]) -> str:
    """{4: "tb", 8: "metrics.jsonl", 12: "metrics.jsonl"} as "4 kB: tb; 8-12 kB: metrics.jsonl"."""
    groups: list[tuple[list[int], str]] = []
    for size, kind in kinds.items():
        if groups and groups[-1][1] == kind:
            groups[-1][0].append(size)
        else:
            groups.append(([size], kind))
    return "; ".join(f"{s[0]}{'-' + str(s[-1]) if len(s) > 1 else ''} kB: {kind}" for s, kind in groups)


def enospc_at(run_dir: Path, n: int) -> str | None:
    real_save, count = torch.save, {"n": 0}

    def save(state, f, *args, **kwargs):
        count["n"] += 1
        if count["n"] == n:
            f.write(b"PK\x03\x04")
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(state, f, *args, **kwargs)

    torch.save = save
    try:
        train(tiny_config(**SECTIONS), run_dir)
        return "the run did not fail"
    except UserError as e:
        message = str(e)
    finally:
        torch.save = real_save
    results = json.loads((run_dir / "results.json").read_text())
    first = "there is no earlier checkpoint" in message
    if "\n" in message or "no space left on" not in message or first != (n == 1):
        return f"message: {message}"
    if (results["status"], results["error"]) != ("failed", message) or message not in (run_dir / "train.log").read_text():
        return "results.json or train.log misses the error"
    return None


def hostile_rows() -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(TESTS / "outputs" / "test_hostile.py")],
                          capture_output=True, text=True, timeout=900, cwd=TESTS.parent)
    passed = int((re.search(r"(\d+) passed", done.stdout) or [0, 0])[1])
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    outcomes = [None] * passed + [line[:200] for line in failed]
    return [row("hostile or broken files: pickled code, torch 2.4-2.13 and 2.14 refusal wordings, nested and malformed "
                "safetensors, damaged checkpoints in every reader, decompression bombs over and between Pillow's "
                "limits, a class unreadable mid-run (tests/outputs/test_hostile.py cases)", outcomes,
                "one line, exit 2, never a traceback; nothing pickled is run")]


GROUPS = {"kill": kill_rows, "fs": fs_rows, "bitflip": bitflip_rows, "writers": writer_rows,
          "diskfull": diskfull_rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="kill,fs,sweep,bitflip,writers,diskfull,hostile")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.getLogger("vit_train").addHandler(logging.NullHandler())  # the runs' own logs go to their train.log
    started, table = time.time(), []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        reference = work / "reference"
        train(tiny_config(**SECTIONS), reference)
        for group in args.only.split(","):
            group_started = time.time()
            table += hostile_rows() if group == "hostile" else sweep_rows(work) if group == "sweep" else \
                GROUPS[group](work, reference)
            print(f"{group}: {time.time() - group_started:.0f} s", file=sys.stderr, flush=True)
    print("| fault injected | times tried | survived | evidence |\n|---|---|---|---|")
    for r in table:
        print(f"| {r['fault']} | {r['tried']} | {r['survived']} | {r['evidence']} |")
    print(f"\n{sum(r['tried'] for r in table)} faults injected, {sum(r['survived'] for r in table)} survived, "
          f"in {time.time() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(table, indent=2) + "\n")


if __name__ == "__main__":
    main()
