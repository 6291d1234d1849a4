"""Several processes: `vit-train --nproc_per_node=N ...` as the launcher (torchrun's, run in vit-train's own
process, so that a stop signal ends the command as it ends one process), and the run directory torchrun's
processes share: rank 0's (Hydra's timestamp can differ between processes started a second apart), found
again after an elastic restart."""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import signal
import sys
from pathlib import Path
from typing import NoReturn

from vit_train.config import Config
from vit_train.outputs import rundir

log = logging.getLogger("vit_train")
RUN_ID_MARKER = ".torchrun_run_id"  # which torchrun chose the directory: its restarts resume there
LAUNCHER = "VIT_TRAIN_LAUNCHER"  # set by `launch` for its processes: the command that continues a stopped run
TORCHRUN_COMMAND = "torchrun <the same options> -m vit_train"  # how the trainer's stop line names the launch
NOT_LAUNCHER = {
    "--help",
    "--module",
    "--no-python",
    "--no_python",
    "--run-path",
    "--run_path",
    "--print-completion",
    "--print_completion",
}  # torchrun's options that vit-train decides itself, or that are vit-train's
HYDRA_FLAGS = {
    "--help",
    "--hydra-help",
    "--version",
    "--cfg",
    "--resolve",
    "--package",
    "--run",
    "--multirun",
    "--shell-completion",
    "--config-path",
    "--config-name",
    "--config-dir",
    "--experimental-rerun",
    "--info",
}


def launcher_options(args: list[str]) -> tuple[list[str], list[str]]:
    """(torchrun's options, the rest) of a vit-train command line: the long options of torchrun's own parser
    (`--nproc_per_node=2`, `--nnodes 1`, `--max-restarts=3`, `--standalone`, ...), given as torchrun takes them,
    and every other argument in its order. None of vit-train's (Hydra's) flags is among torchrun's; inside a
    process torchrun started there are none to find (`launch` passes the rest only)."""
    if "LOCAL_RANK" in os.environ or all(a.split("=", 1)[0] in HYDRA_FLAGS for a in args if a.startswith("--")):
        return [], args  # torch is not imported for a command line without torchrun's options
    from torch.distributed.run import get_args_parser

    takes_value = {
        name: action.nargs != 0
        for action in get_args_parser()._actions
        for name in action.option_strings
        if name.startswith("--") and name not in NOT_LAUNCHER
    }
    options, rest, i = [], [], 0
    while i < len(args):
        name = args[i].split("=", 1)[0]
        if name in takes_value:
            given = 2 if takes_value[name] and "=" not in args[i] and i + 1 < len(args) else 1
            options += args[i : i + given]
            i += given
        else:
            rest.append(args[i])
            i += 1
    return options, rest


def launch(options: list[str], args: list[str]) -> NoReturn:
    """`vit-train OPTIONS ARGS` with torchrun's OPTIONS: torchrun's launcher (torch.distributed.run) in this
    process, starting `python -m vit_train ARGS` in each process as `torchrun OPTIONS -m vit_train ARGS` does.
    Exits as one process would: 0; 128 + the signal's number for a stop signal (SIGINT 130, SIGTERM 143), which
    every process gets once and acts on (they stop at one step, rank 0 writes last.pt and prints one line); a
    failed process's own status (it said why), or 128 + the signal that killed it (said in one line). torchrun
    itself ends a stop with its SignalException's traceback and status 1, and puts its own lines about the
    signal onto the progress bar: here they are not printed. A second Ctrl-C reaches every process as their
    second (they stop at once, keeping the previous checkpoint)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    for name in ("torch.distributed.elastic.agent.server.api", "torch.distributed.elastic.multiprocessing.api"):
        logging.getLogger(name).addFilter(_agent_lines)
    os.environ[LAUNCHER] = shlex.join(["vit-train", *options])
    args = parse_args([*options, "--module", "vit_train", *args])
    # SIGINT stays with this process's handler (torchrun's agent takes the others): a second Ctrl-C is passed on
    args.signals_to_handle = ",".join(s for s in args.signals_to_handle.split(",") if s.strip() != "SIGINT")
    interrupts = []

    def interrupted(signum: int, frame) -> None:
        interrupts.append(signum)
        if len(interrupts) == 1:  # as torchrun's agent: it sends the signal to every process and waits for them
            raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))
        for pid in _children():
            try:
                os.killpg(pid, signal.SIGINT)  # their second Ctrl-C (each leads its own group, as torchrun starts it)
            except OSError:  # ended meanwhile
                pass

    signal.signal(signal.SIGINT, interrupted)
    try:
        run(args)
    except SignalException as e:
        sys.exit(128 + int(e.sigval))
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        if failure.exitcode >= 0:
            sys.exit(failure.exitcode)
        name = signal.Signals(-failure.exitcode).name
        print(f"vit-train: the process of rank {rank} (pid {failure.pid}) was killed by {name}", file=sys.stderr)
        sys.exit(128 - failure.exitcode)
    sys.exit(0)


def _agent_lines(record: logging.LogRecord) -> bool:
    """False for torchrun's agent's lines about a stop signal it received and passes on (printed onto the
    progress bar; the run says it itself) and about a failed process (it said why; `launch` names a signal)."""
    return not str(record.msg).startswith(
        ("Received %s death signal", "Sending process %s closing signal", "failed (exitcode: %s)")
    )


def _children() -> list[int]:
    """The process ids of this process's children (Linux's /proc)."""
    try:
        return [
            int(pid)
            for task in Path(f"/proc/{os.getpid()}/task").iterdir()
            for pid in (task / "children").read_text().split()
        ]
    except OSError:
        return []


def shared_run_dir(config: Config, run_dir: Path, lock: rundir.RunLock | None) -> tuple[Path, rundir.RunLock | None]:
    """Join the process group and use rank 0's run directory (Hydra's timestamp can differ between
    processes started a second apart); an elastic restart (torchrun --max-restarts) resumes: sets
    `config.resume` to auto. Returns the directory and its lock: rank 0 holds it for all processes,
    moving `lock` (the one it took on `run_dir`) there when the directory changes; other ranks None."""
    from vit_train.runtime import distributed  # torch: only once the config is known to be valid

    ctx = distributed.setup(config.trainer.device)
    run_id, restart = os.environ.get("TORCHELASTIC_RUN_ID", ""), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    chosen = run_dir
    if ctx.is_main and restart and run_id:  # the directory the first attempt of this torchrun chose
        for marker in run_dir.parent.parent.glob(f"*/*/{RUN_ID_MARKER}"):
            if marker.read_text() == run_id:
                chosen = marker.parent
    shared = Path(distributed.broadcast(str(chosen)))
    if lock is not None and lock.run_dir != shared.resolve():
        lock.release()
        lock = None
    if shared != run_dir and run_dir.is_dir() and unused(run_dir):
        shutil.rmtree(run_dir, ignore_errors=True)  # the directory Hydra made for this process (or all), unused
    if ctx.is_main and lock is None:
        lock = rundir.acquire(shared)  # rank 0 holds the lock for every process
    if ctx.is_main and run_id:
        shared.mkdir(parents=True, exist_ok=True)
        (shared / RUN_ID_MARKER).write_text(run_id)
    if restart and config.resume is None:
        config.resume = "auto"
        if ctx.is_main:
            log.info("restart %d of the process group: resuming in %s", restart, shared)
    return shared, lock


def unused(run_dir: Path) -> bool:
    """Whether `run_dir` holds nothing but Hydra's record, the lock and torchrun's marker: no run has written
    into it."""
    return {p.name for p in run_dir.iterdir()} <= {".hydra", rundir.LOCK_NAME, RUN_ID_MARKER}


def remove_unused(run_dir: Path) -> None:
    """Remove the directory of a run refused before it started. Under torchrun every process refuses the
    same config at once: rank 0 removes the directory when no run has written into it (`unused`); another
    rank, whose Hydra may have made the directory again after that, removes it only when empty. Nothing
    is raised when another process got there first."""
    try:
        if os.environ.get("RANK", "0") == "0":
            if unused(run_dir):
                shutil.rmtree(run_dir, ignore_errors=True)
                if re.fullmatch(r"\d{4}-\d{2}-\d{2}", run_dir.parent.name):  # Hydra's day folder, left empty
                    run_dir.parent.rmdir()
        else:
            run_dir.rmdir()
    except OSError:  # gone already, or (another rank) rank 0's record still in it: rank 0 removes it
        pass
