"""trainer.compile_scope=step: the whole training step as one compiled graph (train/compiled_step.py).

What the CPU proves: dynamo traces the step whole (`fullgraph=True`: no graph break) and compiles it once for a
run that crosses warmup into cosine, an epoch boundary, checkpoints and a resume (dynamo's counters, and
`error_on_recompile`); the compiled step equals the eager one (losses and weights within the tolerance measured
below); every option it meets works or is refused in one line; the evaluation at one batch shape scores as the
plain one; compile time is kept out of images/s; a stop signal while compiling ends the run at once with the
last checkpoint intact. Most tests compile with `aot_eager` (dynamo's graph through AOT autograd run by
PyTorch's kernels: the structure, in seconds); those that measure numbers use Inductor, as users do.
"""

from __future__ import annotations

import json
import logging
import math
import signal
from pathlib import Path

import pytest
import torch

import helpers.compile_backends as backends
from helpers.configs import tiny_config
from helpers.files import COMPILE_SPLIT, assert_every_file_as_the_reference, read_results, rows
from helpers.kill_resume import stop_then_resume
from vit_train.errors import RunStopped
from vit_train.train.trainer import train

# Measured (tests/train/test_compiled_step.py::test_the_compiled_step_equals_the_eager_one, Inductor, fp32, 50
# steps of a micro ViT with drop path, EMA and clipping across warmup into cosine, 2-core x86-64, torch 2.14.1):
# largest step-loss difference 4.8e-7, largest weight difference 2.0e-5 (EMA 1.6e-5). The bounds are 20x and 5x.
LOSS_ATOL, WEIGHT_ATOL = 1e-5, 1e-4


def step_config(backend: str = "aot_eager", **sections):
    """A micro ViT on shapes with the compiled step (`sections` as tiny_config's; trainer keys added to these)."""
    trainer = {"compile": True, "compile_scope": "step", "compile_backend": backend, **sections.pop("trainer", {})}
    return tiny_config(trainer=trainer, **sections)


@pytest.fixture
def counters():
    """dynamo's counters from zero, every compiled function forgotten (as in a new process)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield torch._dynamo.utils.counters
    torch._dynamo.reset()


def train_rows(run_dir: Path, split: str = "train") -> list[dict]:
    return [r for r in rows(run_dir) if r["split"] == split]


def test_the_step_is_one_graph_compiled_once_across_warmup_epochs_checkpoints_and_a_resume(tmp_path, counters):
    """Warmup ends at step 4 of 8 an epoch; 2 epochs with last.pt every 3 steps; then a resume (dynamo reset: a
    new process) trains a third epoch. Each attempt: the step's graph and the evaluation's, nothing else."""
    sections = {"trainer": {"epochs": 2, "log_every": 1, "ckpt_every": 3}, "schedule": {"warmup_epochs": 0.5}}
    with torch._dynamo.config.patch(error_on_recompile=True):
        results = train(step_config(**sections), tmp_path)
        assert results["steps"] == 16 and results["status"] == "completed"
        assert not counters["graph_break"], dict(counters["graph_break"])
        assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])  # the step; the evaluation
        torch._dynamo.reset()
        counters.clear()
        sections["trainer"]["epochs"] = 3
        results = train(step_config(**sections, resume="auto"), tmp_path)
    assert results["steps"] == 24 and not counters["graph_break"] and counters["stats"]["unique_graphs"] == 2
    lrs = [r["lr"] for r in train_rows(tmp_path)]  # each row: the lr its step trained with
    assert lrs[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3], rel=1e-12)  # warmup: (step / 4) x lr
    assert lrs[3:16] == sorted(lrs[3:16], reverse=True) and lrs[15] < lrs[4]  # cosine, then a longer one resumed


def test_compile_time_is_reported_apart_and_left_out_of_images_per_second(tmp_path, counters, caplog):
    """The first step of each attempt compiles: its seconds go to results.json's compile_seconds, a "compile"
    row of metrics.jsonl (TensorBoard's compile/*) and the log, and its images leave images/s (every row logs,
    so each checkpoint's images_seen is exact)."""
    with caplog.at_level(logging.INFO, logger="vit_train"):
        results = train(step_config(trainer={"max_steps": 6, "log_every": 1}), tmp_path)
    compiled = [r for r in rows(tmp_path) if r["split"] == COMPILE_SPLIT]
    assert [(r["step"], sorted(k for k in r if k.endswith("seconds"))) for r in compiled] == \
        [(1, ["step_seconds"]), (6, ["eval_seconds"])]
    assert math.isclose(results["compile_seconds"], compiled[0]["step_seconds"] + compiled[1]["eval_seconds"])
    assert sum("compiled the training step in" in r.getMessage() for r in caplog.records) == 1
    last = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert last["images_seen"] == (6 - 1) * 32  # the compiling step's 32 images are not counted
    first = train_rows(tmp_path)[0]
    assert first["images_per_s"] is None and all(r["images_per_s"] > 0 for r in train_rows(tmp_path)[1:])


def test_the_eager_step_with_a_compiled_model_leaves_its_first_step_out_too(tmp_path, counters):
    results = train(step_config(trainer={"max_steps": 4, "log_every": 1, "compile_scope": "model"}), tmp_path)
    last = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert last["images_seen"] == 3 * 32 and results["compile_seconds"] > 0


@pytest.mark.slow
def test_the_compiled_step_equals_the_eager_one(tmp_path, counters):
    """Inductor, fp32, 50 steps across warmup into cosine, drop path (the eager kernels draw its masks in the
    graph: the same masks), EMA, clipping: step losses and weights (model, EMA, AdamW's moments) within the
    measured bounds, LOSS_ATOL and WEIGHT_ATOL."""
    sections = {"model": {"drop_path": 0.1}, "data": {"train_size": 640, "val_size": 64, "batch_size": 32},
                "schedule": {"warmup_epochs": 1.0}, "optim": {"clip_grad": 1.0}}
    trainer = {"epochs": 3, "max_steps": 50, "log_every": 1, "ema_decay": 0.9}
    train(tiny_config(**sections, trainer=trainer), tmp_path / "eager")
    train(step_config("inductor", **sections, trainer=trainer), tmp_path / "step")
    losses = [(a["loss"], b["loss"]) for a, b in zip(train_rows(tmp_path / "eager"), train_rows(tmp_path / "step"))]
    assert len(losses) == 50 and max(abs(a - b) for a, b in losses) <= LOSS_ATOL
    eager, step = (torch.load(tmp_path / d / "checkpoints" / "last.pt", weights_only=True) for d in ("eager", "step"))
    for part in ("model", "ema"):
        for name, value in eager[part].items():
            torch.testing.assert_close(step[part][name], value, rtol=0, atol=WEIGHT_ATOL, msg=f"{part}.{name}")
    for index, state in eager["optimizer"]["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(step["optimizer"]["state"][index][key], state[key], rtol=0, atol=WEIGHT_ATOL)
        assert float(step["optimizer"]["state"][index]["step"]) == float(state["step"]) == 50


# What the compiled step meets: each option trains through it, equal to the eager step (aot_eager runs PyTorch's
# own kernels, so the bound is the capturable AdamW's float32 bias corrections, not a compiler's).
OPTIONS = {
    "sgd": {"optim": {"name": "sgd", "lr": 0.05}},
    "ema": {"trainer": {"ema_decay": 0.5}},
    "accumulation": {"trainer": {"accum_steps": 2}},
    "mixup-cutmix": {"aug": {"name": "deit"}},
    "layer-decay": {"optim": {"layer_decay": 0.75}},
    "dropout": {"model": {"dropout": 0.1, "drop_path": 0.2}},
    "mae": {"objective": {"name": "mae"}},
    # BatchNorm on a batch of 32 amplifies rounding: measured after one SGD step 1.5e-8 apart (the update's float32
    # rounding, foreach against torch's per-tensor loop), after two 2e-5, by the sixth step's loss 3e-3: two steps
    "resnet18": {"model": {"arch": "resnet18", "img_size": 32}, "trainer": {"max_steps": 2}},
    "bf16": {"trainer": {"precision": "bf16"}},
}


@pytest.mark.slow
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_each_option_trains_through_the_compiled_step_as_through_the_eager_one(tmp_path, option, counters, caplog):
    sections = json.loads(json.dumps(OPTIONS[option]))
    trainer = {"max_steps": 6, "log_every": 1, **sections.pop("trainer", {})}
    with caplog.at_level(logging.WARNING, logger="vit_train"):
        train(tiny_config(**sections, trainer=trainer), tmp_path / "eager")
        train(step_config(**sections, trainer=trainer), tmp_path / "step")
    assert not [r.getMessage() for r in caplog.records if "compile" in r.getMessage()]  # no fallback, no note
    assert not counters["graph_break"]
    bound = 1e-2 if option == "bf16" else LOSS_ATOL
    for a, b in zip(train_rows(tmp_path / "eager"), train_rows(tmp_path / "step"), strict=True):
        assert abs(a["loss"] - b["loss"]) <= bound, (a, b)


@pytest.mark.slow
def test_distillation_trains_through_the_compiled_step(tmp_path, counters, caplog):
    """A vit-train teacher checkpoint (objective=distill); its terms (label, teacher, agreement) logged alike."""
    from vit_train.data.sources.shapes import CLASS_NAMES

    teacher_cfg = tiny_config(model={"depth": 1})
    torch.save({"model": teacher_cfg.model.build(10).state_dict(), "config": teacher_cfg.to_dict(),
                "class_names": list(CLASS_NAMES), "ema": None, "step": 0}, tmp_path / "teacher.pt")
    sections = {"objective": {"name": "distill", "teacher": str(tmp_path / "teacher.pt")}, "model": {"distilled": True},
                "trainer": {"max_steps": 4, "log_every": 2}}
    with caplog.at_level(logging.WARNING, logger="vit_train"):
        train(tiny_config(**json.loads(json.dumps(sections))), tmp_path / "eager")
        train(step_config(**json.loads(json.dumps(sections))), tmp_path / "step")
    assert not [r.getMessage() for r in caplog.records if "compile" in r.getMessage()]
    for a, b in zip(train_rows(tmp_path / "eager"), train_rows(tmp_path / "step"), strict=True):
        for key in ("loss", "loss_label", "loss_teacher", "teacher_agreement"):
            assert abs(a[key] - b[key]) <= LOSS_ATOL, (key, a, b)


def test_a_compiler_that_fails_leaves_one_warning_and_the_eager_step(tmp_path, counters, caplog):
    backends.arm(1)
    with caplog.at_level(logging.WARNING, logger="vit_train"):
        results = train(step_config("vit_test_failing", trainer={"max_steps": 4, "log_every": 1}), tmp_path / "failed")
    said = [r.getMessage() for r in caplog.records if "could not be compiled" in r.getMessage()]
    assert len(said) == 1 and "this compiler failed on purpose" in said[0] and "the eager step runs" in said[0]
    assert results["status"] == "completed" and results["steps"] == 4
    assert not [r for r in caplog.records if "compiled the training step in" in r.getMessage()]  # not "compiled"
    assert results["compile_seconds"] > 0 and all(r["images_per_s"] for r in train_rows(tmp_path / "failed")[1:])
    train(tiny_config(trainer={"max_steps": 4, "log_every": 1}), tmp_path / "eager")
    for a, b in zip(train_rows(tmp_path / "eager"), train_rows(tmp_path / "failed"), strict=True):
        assert abs(a["loss"] - b["loss"]) <= LOSS_ATOL


def test_a_backend_that_cannot_compile_here_is_one_line_before_any_work(tmp_path, monkeypatch):
    """A backend torch lists but cannot run (tvm without apache-tvm, reported as a Hydra traceback at the first
    evaluation): tried on one addition when the run is built, refused in one line."""
    import vit_train.train.compiling as compiling
    from vit_train.errors import ConfigError

    def broken(gm, example_inputs):
        raise ImportError("Please install apache-tvm")

    monkeypatch.setattr(torch._dynamo, "list_backends", lambda exclude_tags=(): ["inductor", "vit_test_broken"])
    monkeypatch.setattr(compiling.torch, "compile", lambda fn, backend=None, **kw: torch._dynamo.optimize(broken)(fn))
    with pytest.raises(ConfigError, match=r"^trainer.compile_backend=vit_test_broken cannot compile here \(.*Please "
                                          r"install apache-tvm\); install what it needs or give another backend"):
        train(step_config("vit_test_broken", trainer={"max_steps": 1}), tmp_path)
    assert not (tmp_path / "checkpoints").exists()


def test_an_evaluation_that_cannot_be_compiled_runs_eagerly_said_once(tmp_path, counters, caplog):
    backends.arm(2)  # the step's compilation, then the evaluation's fails
    with caplog.at_level(logging.WARNING, logger="vit_train"):
        results = train(step_config("vit_test_failing", trainer={"max_steps": 8, "eval_every": 4}), tmp_path)
    said = [r.getMessage() for r in caplog.records if "could not be compiled" in r.getMessage()]
    assert said == ["the evaluation could not be compiled (RuntimeError: this compiler failed on purpose "
                    "(tests/helpers/compile_backends.py)); it runs eagerly"]
    assert results["status"] == "completed" and len([r for r in rows(tmp_path) if r["split"] == "val"]) == 2


def test_a_torch_that_cannot_trace_the_backward_compiles_the_model_instead(tmp_path, counters, caplog, monkeypatch):
    import vit_train.train.compiling as compiling

    monkeypatch.setattr(compiling, "traces_backward", lambda: False)
    with caplog.at_level(logging.WARNING, logger="vit_train"):
        results = train(step_config(trainer={"max_steps": 2}), tmp_path)
    said = [r.getMessage() for r in caplog.records if "compile" in r.getMessage()]
    assert len(said) == 1 and "cannot trace the backward pass" in said[0] and "trainer.compile_scope=model" in said[0]
    assert results["status"] == "completed" and results["compile_seconds"] > 0


@pytest.mark.parametrize("mode, said", [("reduce-overhead", True), pytest.param("max-autotune", True, marks=pytest.mark.slow),
                                        pytest.param("default", False, marks=pytest.mark.slow)])
def test_a_cuda_graph_mode_on_the_cpu_says_so_once(tmp_path, counters, caplog, mode, said):
    with caplog.at_level(logging.WARNING, logger="vit_train"):
        train(step_config(trainer={"max_steps": 1, "compile_mode": mode}), tmp_path)
    lines = [r.getMessage() for r in caplog.records if "CUDA graphs" in r.getMessage()]
    assert lines == ([f"trainer.compile_mode={mode} replays CUDA graphs, which need a CUDA device: on cpu it compiles "
                      f"without them"] if said else [])


def test_an_unknown_backend_is_one_line(tmp_path):
    from vit_train.errors import ConfigError

    with pytest.raises(ConfigError, match=r"trainer.compile_backend=inductr is not a torch.compile backend here; "
                                          r"choose one of .*inductor"):
        train(step_config("inductr", trainer={"max_steps": 1}), tmp_path)


@pytest.mark.parametrize("kind", ["classify", "mae"])
def test_evaluation_at_one_batch_shape_scores_as_the_plain_one(kind):
    """StaticBatch pads the last val batch (20 of 32 here) with zeros and cuts the outputs back: the same top-1,
    top-5 and loss (MAE: reconstruction loss, its noise padded alike) as the plain model on the same batches."""
    from vit_train.train.compiling import StaticBatch

    cfg = tiny_config(data={"val_size": 84}, objective={"name": kind})
    torch.manual_seed(0)
    model = cfg.objective.build_model(cfg, 10)
    data = cfg.data.build(cfg, torch.device("cpu"), 0, 1, labels=True)
    assert [len(x) for x, _ in data.val_loader][-1] == 20
    plain = cfg.objective.evaluate(model, data.val_loader, torch.device("cpu"), None, cfg)
    static = cfg.objective.evaluate(StaticBatch(model, 32), data.val_loader, torch.device("cpu"), None, cfg)
    assert plain.keys() == static.keys()
    for key in plain:
        assert static[key] == pytest.approx(plain[key], rel=1e-6, abs=1e-6), key
    if kind == "classify":
        assert static["top1"] == plain["top1"] and static["top5"] == plain["top5"]


def test_static_batch_pads_every_argument_of_the_batch_and_copies_its_outputs():
    from vit_train.train.compiling import StaticBatch

    seen = []

    class Module(torch.nn.Module):
        def forward(self, x, noise):
            seen.append((tuple(x.shape), tuple(noise.shape)))
            return x * 2, noise[:, :1]

    wrapped = StaticBatch(Module(), 4)
    x, noise = torch.ones(3, 2), torch.arange(6.0).reshape(3, 2)
    out, first = wrapped(x, noise)
    assert seen == [((4, 2), (4, 2))] and torch.equal(out, 2 * x) and torch.equal(first, noise[:, :1])
    assert wrapped.seconds is not None


def test_keep_rate_and_independence_of_dropout_and_drop_path_under_the_compiled_step():
    """pytorch #198333: since torch 2.13 Inductor's random path duplicated dropout masks (4 rows alike) and drew
    the backward's mask apart from the forward's. Compiled as the step is (`compile_options`), per sample: the
    keep rate within 5 sigma of 1 - p, no two masks alike, drop path's kept rows independent of each other and
    of the next call, and the gradient's mask the forward's."""
    from torchvision.ops import StochasticDepth

    from vit_train.train.compiling import compile_options

    p, rows_, width = 0.25, 512, 256
    dropout, drop_path = torch.nn.Dropout(p), StochasticDepth(p, mode="row")

    def masks(x, w):
        y = dropout(x * w)
        return y, drop_path(x), drop_path(x)

    compiled = torch.compile(masks, fullgraph=True, options=compile_options("default", torch.device("cpu")))
    x, w = torch.ones(rows_, width), torch.ones(width, requires_grad=True)
    y, paths, again = compiled(x, w)
    kept = (y != 0).float()
    sigma = math.sqrt(p * (1 - p) / kept.numel())
    assert abs(kept.mean().item() - (1 - p)) < 5 * sigma
    assert len({tuple(row.tolist()) for row in kept.bool()}) == rows_  # no duplicated masks
    path_kept = paths[:, 0] != 0
    assert abs(path_kept.float().mean().item() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / rows_)
    both = (path_kept & (again[:, 0] != 0)).float().mean().item()  # two draws: independent
    assert abs(both - (1 - p) ** 2) < 5 * math.sqrt((1 - p) ** 2 * (1 - (1 - p) ** 2) / rows_)
    y.sum().backward()
    assert torch.allclose(w.grad, kept.sum(0) / (1 - p))  # backward's mask is the forward's


def stop_while_compiling(tmp_path: Path, n: int, signum: int, resume: str | None = None) -> RunStopped:
    """Train with the signalling backend armed at the n-th compilation (1: the step's, 2: the evaluation's)."""
    backends.arm(n, signum)
    with pytest.raises(RunStopped) as stopped:
        train(step_config("vit_test_signalling", trainer={"epochs": 2, "log_every": 1}, resume=resume), tmp_path)
    return stopped.value


@pytest.mark.parametrize("signum", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)], ids=["TERM", "INT"])
def test_a_stop_while_the_first_step_compiles_ends_the_run_at_once_with_nothing_lost(tmp_path, counters, signum):
    """A resumed run (one epoch trained eagerly, checkpointed) stopped while its first compiled step compiles:
    it ends within seconds (the backend would wait a minute), last.pt as it was, results.json interrupted at the
    checkpoint's step, no row past it; a fresh run stopped so says that nothing was trained."""
    import time

    train(tiny_config(trainer={"epochs": 1, "log_every": 1}), tmp_path)
    before = (tmp_path / "checkpoints" / "last.pt").read_bytes()
    stopped = stop_while_compiling(tmp_path, 1, signum, resume="auto")
    assert time.monotonic() - backends.SETTINGS["sent"] < 10  # from the signal; the backend would wait a minute
    assert stopped.exit_code == 128 + signum
    name = signal.Signals(signum).name
    # nothing was saved, so the line repeats what this attempt changed from the checkpoint's config
    assert str(stopped) == (f"stopped by {name} while compiling the training step: {tmp_path / 'checkpoints' / 'last.pt'}"
                            f" holds step 8; continue with: vit-train resume={tmp_path} trainer.compile=true "
                            f"trainer.compile_backend=vit_test_signalling trainer.compile_scope=step trainer.epochs=2")
    assert (tmp_path / "checkpoints" / "last.pt").read_bytes() == before
    results = read_results(tmp_path)
    assert results["status"] == "interrupted" and results["steps"] == 8 and results["epochs"] == 1.0
    assert max(r["step"] for r in rows(tmp_path)) == 8
    fresh = stop_while_compiling(tmp_path / "fresh", 1, signum)
    assert str(fresh) == f"stopped by {name} while compiling the training step: nothing was trained; start it again " \
                         f"with the same command"
    assert not (tmp_path / "fresh" / "checkpoints").exists() or not list((tmp_path / "fresh" / "checkpoints").iterdir())
    assert read_results(tmp_path / "fresh")["steps"] == 0


@pytest.mark.slow
def test_a_stop_while_the_first_evaluation_compiles_checkpoints_and_the_resume_evaluates_first(tmp_path, counters):
    """SIGTERM while the evaluation at the end of epoch 1 compiles: the evaluation is dropped, last.pt holds the
    epoch's 8 steps, and the resumed run does that evaluation first; every file ends as the uninterrupted run's."""
    reference = tmp_path / "reference"
    backends.arm(10**9)
    train(step_config("vit_test_signalling", trainer={"epochs": 2, "log_every": 1}), reference)
    torch._dynamo.reset()
    run_dir = tmp_path / "stopped"
    stopped = stop_while_compiling(run_dir, 2, signal.SIGTERM)
    assert stopped.exit_code == 143 and "stopped by SIGTERM at step 8" in str(stopped)
    assert read_results(run_dir)["status"] == "interrupted" and not [r for r in rows(run_dir) if r["split"] == "val"]
    torch._dynamo.reset()
    backends.arm(10**9)
    train(step_config("vit_test_signalling", trainer={"epochs": 2, "log_every": 1}, resume="auto"), run_dir)
    assert_every_file_as_the_reference(run_dir, reference)


# The resume matrix's cells for the compiled step (Inductor, as users run it): drop path and dropout drawn inside
# the graph, aug=deit on the device pipeline (MixUp/CutMix outside it), an EMA; MAE's masks drawn outside it.
RESUMED = {
    "device-deit-ema": {"model": {"dropout": 0.1, "drop_path": 0.2}, "aug": {"name": "deit"},
                        "data": {"pipeline": "device"}, "trainer": {"ema_decay": 0.5}},
    "loader-mae": {"objective": {"name": "mae"}, "model": {"drop_path": 0.1}, "data": {"num_workers": 2}},
}


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["KILL", "TERM"])
@pytest.mark.parametrize("cell", sorted(RESUMED))
def test_a_compiled_run_stopped_mid_epoch_resumes_as_the_uninterrupted_run(tmp_path, counters, cell, signal_name):
    """kill -9 or SIGTERM after the 11th train row (epoch 2, between checkpoints every 5 steps), then resume=auto:
    every file a user reads as the uninterrupted compiled run's (tests/train/test_resume_matrix.py's oracle)."""
    sections = json.loads(json.dumps(RESUMED[cell]))
    sections["data"] = {"train_size": 64, "val_size": 16, "batch_size": 8, **sections.get("data", {})}
    sections["trainer"] = {"epochs": 2, "log_every": 1, "ckpt_every": 5, "keep_last": 1, "compile": True,
                           "compile_scope": "step", **sections.get("trainer", {})}
    reference = tmp_path / "reference"
    train(tiny_config(**sections), reference)
    stop_then_resume(tmp_path / "stopped", sections, reference, signal_name, timeout=600,
                     before_resume=torch._dynamo.reset)


@pytest.mark.slow
def test_a_group_sigterm_while_compiling_ends_the_command_within_seconds(tmp_path):
    """The command line, its process group sent SIGTERM while the first step compiles (the backend waits up to a
    minute): exit 143 within 10 s, one "received SIGTERM" line and no traceback; nothing was trained."""
    import os
    import subprocess
    import sys
    import time

    from helpers.configs import TINY

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "VIT_TEST_COMPILE_N": "1"}
    args = [*TINY, "data.num_workers=2", "trainer.compile=true", "trainer.compile_scope=step",
            "trainer.compile_backend=vit_test_signalling", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.Popen([sys.executable, backends.__file__, *args], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    before = []
    while (line := proc.stdout.readline()) not in ("compiling\n", ""):
        before.append(line)
    assert line == "compiling\n", before
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    out, err = "".join(before) + out, err + out  # the log's lines go to the console's stdout
    assert time.monotonic() - sent < 10
    assert proc.returncode == 143, err
    assert err.count("received SIGTERM") == 1 and "Traceback" not in err, err
    assert "stopped by SIGTERM while compiling the training step: nothing was trained" in err
    assert read_results(tmp_path / "run")["status"] == "interrupted"


def test_cuda_graphs_skipped_by_inductor_are_named_with_inductors_reason():
    """Inductor compiles but will not replay as a CUDA graph ("skipping cudagraphs due to mutated inputs"): it
    logs that only under TORCH_LOGS=cudagraphs, so the step would run without them unsaid. What it logs is kept;
    a skip counted but not logged where expected is said all the same."""
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    from vit_train.train.compiling import cuda_graph_skips

    with cuda_graph_skips() as reasons:
        log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to mutated inputs (2 instances)")
    assert reasons == ["mutated inputs (2 instances)"]
    with cuda_graph_skips() as reasons:
        torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] += 1
    assert reasons == ["Inductor skipped CUDA graphs; TORCH_LOGS=cudagraphs says why"]
    with cuda_graph_skips() as reasons:
        pass
    assert reasons == []


@pytest.mark.slow
def test_with_two_processes_the_model_is_compiled_instead_said_once(tmp_path):
    """DDP all-reduces the gradients outside any graph: rank 0 says so in one line, and both ranks train with the
    model compiled (trainer.compile_scope=model)."""
    from helpers.configs import TINY
    from helpers.runs import torchrun

    done = torchrun(*TINY, "trainer.max_steps=2", "trainer.compile=true", "trainer.compile_scope=step",
                    "trainer.compile_backend=aot_eager", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert said.count("trainer.compile_scope=step: with 2 processes the gradients are all-reduced by DDP/FSDP outside "
                      "any graph; the model is compiled instead (trainer.compile_scope=model)") == 1
    assert read_results(tmp_path / "run")["compile_seconds"] > 0


def test_a_resumed_epochs_short_last_batch_takes_one_eager_step_not_a_second_graph(tmp_path, counters):
    """data.batch_size changed at a mid-epoch resume (32 -> 24, from step 3's checkpoint of 8-step epochs): the epoch's
    rest ends in a batch of 8, which the eager step takes; the graph is compiled once, and its compile time alone is
    left out of images/s (a second compilation counted as training made the run's images/s a tenth of itself)."""
    sections = {"trainer": {"epochs": 2, "log_every": 1, "ckpt_every": 3, "keep_last": 10}}
    train(step_config(**sections), tmp_path / "first")
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(error_on_recompile=True):
        results = train(step_config(**sections, data={"batch_size": 24},
                                    resume=str(tmp_path / "first" / "checkpoints" / "step_00000003.pt")),
                        tmp_path / "first")
    assert results["status"] == "completed" and counters["stats"]["unique_graphs"] == 2  # the step, the evaluation
    sizes = [r for r in rows(tmp_path / "first") if r["split"] == "train" and r["step"] > 3]
    assert all(r["images_per_s"] is None or r["images_per_s"] > 0 for r in sizes)


@pytest.mark.parametrize("scope", ["eager", "step"])
def test_max_bad_steps_stops_the_compiled_step_where_it_stops_the_eager_one(tmp_path, counters, scope):
    """optim.lr=1e9: the first step is finite, every later one not. trainer.max_bad_steps=3 stops at step 4 with exit 3
    (the count read every step on the CPU), the compiled step as the eager one; last.pt is step 3's (two skipped steps
    left the weights as step 1 made them), no checkpoint after it (the compiled step once ran on to step 9 and wrote
    step 8's, its count read at logs only)."""
    sections = {"optim": {"lr": 1e9}, "trainer": {"epochs": 2, "max_bad_steps": 3, "ckpt_every": 3, "log_every": 50,
                                                  "keep_last": 10}}
    cfg = step_config(**sections) if scope == "step" else tiny_config(**sections)
    with pytest.raises(RunStopped) as stopped:
        train(cfg, tmp_path)
    results = read_results(tmp_path)
    assert stopped.value.exit_code == 3 and results["status"] == "diverged"
    assert (results["steps"], results["skipped_steps"]) == (4, 3)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt")) == ["last.pt", "step_00000003.pt"]
