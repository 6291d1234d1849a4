"""The fault table of docs/reliability.md: each fault injected as an adversary would, how often, how
many runs survived it, and the evidence. Prints a Markdown table (and writes it as JSON with --json).

    OMP_NUM_THREADS=1 python scripts/fault_table.py [--only kill,fs,sweep,bitflip,writers,diskfull,hostile]
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
tmpfs mounts (tests/helpers/diskfull.py; needs `unshare`), the hostile files tests/test_hostile.py.
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
import traceback
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))
from helpers.configs import TINY, tiny_config  # noqa: E402
from helpers.files import assert_every_file_as_the_reference, assert_same_sweep  # noqa: E402
from helpers.fs_killer import arm as arm_fs  # noqa: E402
from helpers.killer import arm  # noqa: E402
from helpers.sweep_runs import run_sweep_job, sweep  # noqa: E402

import torch  # noqa: E402

from vit_train.outputs.checkpoint import load_checkpoint  # noqa: E402
from vit_train.errors import UserError  # noqa: E402
from vit_train.sweeps.job import run_job  # noqa: E402
from vit_train.train.trainer import train  # noqa: E402

# seed 1, evaluations at 4, 8, 12, 16: new bests at 4 and 12 (the final evaluation is not better, so the
# save at 16 rotates step 12's own file away and best.pt alone keeps its weights)
SECTIONS = {"trainer": {"log_every": 1, "ckpt_every": 3, "keep_last": 2, "eval_every": 4}, "seed": 1}
SAVES = 8  # checkpoint writes in the reference run
KILLS = ([("row", n) for n in range(1, 17)] + [("val_row", n) for n in range(1, 5)]
         + [(fault, n) for fault in ("mid_write", "tmp_done", "renamed") for n in range(1, SAVES + 1)] + [("results", 1)])
TWICE = [(("row", 2), ("mid_write", 1)), (("mid_write", 3), ("row", 4)), (("tmp_done", 2), ("renamed", 3))]
PAUSES = [(("row", 1), "command"), (("mid_write", 2), "train"), (("val_row", 1), "sweep job"), (("row", 7), "command"),
          (("tmp_done", 4), "train"), (("row", 14), "sweep job")]
TMPFS_KB = [4, 8, 12, 16, 32, 64, 128, 200, 290, 350, 450, 600, 900]


def killer(run_dir: Path, fault: str, n: int, resume: str | None = None, stop: bool = False) -> int:
    """A child process (forked: no second start-up of Python and torch) that trains in `run_dir` and is
    killed by SIGKILL, or paused by SIGSTOP, at the n-th `fault` (tests/helpers/killer.py); its pid."""
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            arm(fault, n, signal.SIGSTOP if stop else signal.SIGKILL)
            train(tiny_config(**SECTIONS, resume=resume), run_dir)
        except BaseException:  # noqa: BLE001 - reported by the parent as "not killed"
            traceback.print_exc()
            status = 1
        os._exit(status)
    return pid


def killed(run_dir: Path, fault: str, n: int, resume: str | None = None) -> None:
    _, status = os.waitpid(killer(run_dir, fault, n, resume), 0)
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        raise AssertionError(f"not killed at {fault} {n}: wait status {status}")


def same(run_dir: Path, reference: Path, oracle=assert_every_file_as_the_reference) -> str | None:
    """None when every file of the run (or sweep) is the reference's, else the first difference."""
    try:
        oracle(run_dir, reference)
    except AssertionError as e:
        return str(e).splitlines()[0][:200] or "differs"
    return None


def resumed(run_dir: Path, reference: Path) -> str | None:
    try:
        train(tiny_config(**SECTIONS, resume="auto"), run_dir)
    except Exception as e:  # noqa: BLE001 - any failure to resume is a fault not survived
        return f"resume failed: {type(e).__name__}: {e}"[:200]
    return same(run_dir, reference)


def row(fault: str, outcomes: list[str | None], evidence: str) -> dict:
    failures = [o for o in outcomes if o]
    return {"fault": fault, "tried": len(outcomes), "survived": len(outcomes) - len(failures),
            "evidence": evidence + (f"; FAILED: {failures[0]}" if failures else "")}


def kill_rows(work: Path, reference: Path) -> list[dict]:
    outcomes = []
    for k, (fault, n) in enumerate(KILLS):
        run_dir = work / f"kill_{k}"
        killed(run_dir, fault, n)
        outcomes.append(resumed(run_dir, reference))
    twice = []
    for k, ((fault_a, n_a), (fault_b, n_b)) in enumerate(TWICE):
        run_dir = work / f"twice_{k}"
        killed(run_dir, fault_a, n_a)
        killed(run_dir, fault_b, n_b, resume="auto")
        twice.append(resumed(run_dir, reference))
    return [row("kill -9 at one moment: after each of the 16 train rows, after each of the 4 val rows, in the middle "
                f"of each of the {SAVES} checkpoint writes, with each temporary file complete but not renamed, right "
                "after each rename, before results.json", outcomes,
                "`resume=auto`: every file as the reference's (last.pt, best.pt, step files, results.json, "
                "metrics.jsonl, every TensorBoard tag, train.log's closing line), no *.tmp"),
            row("kill -9 twice (the resumed run killed again: " + ", ".join(f"{a[0]} {a[1]} then {b[0]} {b[1]}"
                                                                         for a, b in TWICE) + ")", twice,
                "after the second `resume=auto` every file as the reference's")]


def fs_killed(run_dir: Path, n: int, listing: list | None = None) -> bool:
    """A forked child trains in `run_dir` and is SIGKILLed before its n-th file-system call on checkpoints/
    or results.json (n = 0: never; the calls are appended to `listing`); whether it was killed."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        calls: list = []
        try:
            arm_fs(run_dir, n, calls)
            train(tiny_config(**SECTIONS), run_dir)
            os.write(write, json.dumps(calls).encode())
        except BaseException:  # noqa: BLE001 - reported by the parent as "not killed"
            traceback.print_exc()
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if listing is not None and data:
        listing += json.loads(data)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def fs_rows(work: Path, reference: Path) -> list[dict]:
    """A kill before each file-system call (open for writing, fsync, rename, link, unlink) of every save
    of the run and of results.json, then `resume=auto`."""
    calls: list = []
    if fs_killed(work / "fs_calls", 0, calls) or not calls:
        return [row("kill -9 before each file-system call of the saves", ["could not list the calls"], "")]
    outcomes = []
    for n in range(1, len(calls) + 1):
        run_dir = work / f"fs_{n}"
        if not fs_killed(run_dir, n):
            outcomes.append(f"not killed at call {n} {calls[n - 1]}")
            continue
        outcome = resumed(run_dir, reference)
        outcomes.append(outcome and f"call {n} {' '.join(calls[n - 1])}: {outcome}")
    kinds = {}
    for kind, _ in calls:
        kinds[kind.replace("os.", "")] = kinds.get(kind.replace("os.", ""), 0) + 1
    return [row(f"kill -9 before each file-system call of the run's {SAVES} checkpoint saves and results.json, "
                f"{len(calls)} calls (" + ", ".join(f"{v} {k}" for k, v in kinds.items()) + ")", outcomes,
                "`resume=auto`: every file as the reference's; best.pt names the step results.json names")]


SWEEP_GRID = [["optim.lr=0.001"], ["optim.lr=0.0005"]]
SWEEP_KILLS = [("row", 5), ("val_row", 2), ("mid_write", 4), ("tmp_done", 6), ("renamed", 6), ("results", 1)]


def sweep_rows(work: Path) -> list[dict]:
    """A sweep of 2 jobs (tests/helpers/sweep_runs.py: run_job and the summary, as `vit-train -m` runs them)
    whose second job is killed at each moment, then re-run with the grid in the same and the reverse order."""
    reference = work / "sweep_reference"
    sweep(reference, SWEEP_GRID, SECTIONS)
    outcomes = []
    for k, (fault, n) in enumerate(SWEEP_KILLS):
        for order in (1, -1):
            sweep_dir = work / f"sweep_{k}_{order}"
            run_sweep_job(sweep_dir, 0, SWEEP_GRID[0], SECTIONS)
            pid = os.fork()
            if pid == 0:
                status = 1
                try:
                    arm(fault, n)
                    run_sweep_job(sweep_dir, 1, SWEEP_GRID[1], SECTIONS)
                except BaseException:  # noqa: BLE001 - reported by the parent as "not killed"
                    traceback.print_exc()
                os._exit(status)
            _, status = os.waitpid(pid, 0)
            if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
                outcomes.append(f"job 1 not killed at {fault} {n}")
                continue
            try:
                sweep(sweep_dir, SWEEP_GRID[::order], SECTIONS)
            except Exception as e:  # noqa: BLE001 - a re-run that fails is a fault not survived
                outcomes.append(f"re-run failed: {type(e).__name__}: {e}"[:200])
                continue
            outcome = same(sweep_dir, reference, assert_same_sweep)
            outcomes.append(outcome and f"{fault} {n} ({'reversed' if order < 0 else 'same order'}): {outcome}")
    return [row("a sweep job killed (kill -9 at " + ", ".join(f"{f} {n}" for f, n in SWEEP_KILLS) + "), then the "
                "sweep re-run with its grid in the same and in the reverse order", outcomes,
                "every job's files as the uninterrupted sweep's, no refused.json, summary.csv and summary.md the "
                "same but for timing columns")]


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
    import vit_train.outputs.checkpoint as checkpoint_module

    real_save, count = checkpoint_module.torch.save, {"n": 0}

    def save(state, f, *args, **kwargs):
        count["n"] += 1
        if count["n"] == n:
            f.write(b"PK\x03\x04")
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(state, f, *args, **kwargs)

    checkpoint_module.torch.save = save
    try:
        train(tiny_config(**SECTIONS), run_dir)
        return "the run did not fail"
    except UserError as e:
        message = str(e)
    finally:
        checkpoint_module.torch.save = real_save
    results = json.loads((run_dir / "results.json").read_text())
    first = "there is no earlier checkpoint" in message
    if "\n" in message or "no space left on" not in message or first != (n == 1):
        return f"message: {message}"
    if (results["status"], results["error"]) != ("failed", message) or message not in (run_dir / "train.log").read_text():
        return "results.json or train.log misses the error"
    return None


def hostile_rows() -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(TESTS / "test_hostile.py")],
                          capture_output=True, text=True, timeout=900, cwd=TESTS.parent)
    passed = int((re.search(r"(\d+) passed", done.stdout) or [0, 0])[1])
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    outcomes = [None] * passed + [line[:200] for line in failed]
    return [row("hostile or broken files: pickled code, torch 2.4-2.13 and 2.14 refusal wordings, nested and malformed "
                "safetensors, damaged checkpoints in every reader, decompression bombs over and between Pillow's "
                "limits, a class unreadable mid-run (tests/test_hostile.py cases)", outcomes,
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
