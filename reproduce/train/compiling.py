"""``train.compile``: whether a run trains through ``torch.compile`` of its training loss.

``off`` and ``on`` are taken as they are. ``auto`` times it, as ``precision: auto`` times bf16:
a few training steps of the table's base at the run's scale (the model ``precision`` times), on
one rank's micro-batch, in the precision the run takes, eager and compiled, on the device the
run trains on, each timed step on a batch shape new to both as a run's are
(``step_time.seconds_compiled``). Compiling is taken where the compiled step is
``MARGIN`` faster *and* the seconds it saves over the run's steps exceed the seconds compiling
took: a short run, or a small gain, stays eager. The timings are cached per device, torch
version, precision and model shape (``runs/timings.json``, ``timings.measured``), so every
rank of a run and every later run on the machine read the same answer; the decision (which
depends on the run's steps) and its timings go into the record (``compile_choice``). Where
``torch.compile`` fails, while timing or on a run's first step, the run trains eager and says so
in one line (``lit.TranslationModule``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from reproduce.config import Config
from reproduce.errors import one_line
from reproduce.paths import runs_dir
from reproduce.records.sweep import PlannedRun
from reproduce.train import step_time, timings
from reproduce.train.devices import ONE_DEVICE, Layout, threads_of_one_rank
from reproduce.util.machine import cpu_flags, cpu_name

log = logging.getLogger("reproduce")

# The compiled step must be this much faster to be taken: a near tie stays eager, the kernels the
# paper's numbers are checked against (and without a compile's minutes at every start).
MARGIN = 1.1


# The oldest torch the fast path has trained on (a lent GPU's image: 2.11; this project's CPUs:
# 2.13). Older, ``on`` and ``auto`` train eager, and say so: dynamic shapes without duck sizing,
# ``fallback_random`` and a whole-graph loss are younger than torch.compile itself.
OLDEST_TORCH = (2, 11)


def _torch_version(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _device(accelerator: str) -> str:
    """The name of what a run trains on, for the cache: the GPU's, or the CPU's with its flags
    and threads (a step's time on a CPU depends on them)."""
    if accelerator == "gpu" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"{cpu_name()}|{','.join(cpu_flags())}|{torch.get_num_threads()}t"


# How the timings were taken; a cache entry of another method is timed again. 4: the fast path
# with its projections fused (3: without; the padded loss, compiled whole with dynamic shapes, the
# timed steps on new batch shapes; 2: the output loss left eager; 1: one shape, traced whole).
METHOD = 4


def _key(config, tokens: int, precision: str, device: str) -> str:
    return (f"compile|{device}|torch {torch.__version__}|{precision}|"
            f"{timings.shape_key(config, tokens)}|timed {METHOD}")


_read = timings.read_timings


def decide(timed: dict[str, Any], micro_steps: int) -> tuple[bool, str]:
    """Whether the timings ``timed`` (``seconds_compiled``'s, or a failure) say compiling pays
    over ``micro_steps`` forward and backward passes, and why, in words."""
    if "failed" in timed:
        return False, f"torch.compile failed while timing ({timed['failed']}): eager"
    eager, compiled, cost = timed["eager"], timed["compiled"], timed["compile_seconds"]
    saved = (eager - compiled) * micro_steps
    ratio = eager / compiled if compiled > 0 else float("inf")
    if ratio < MARGIN:
        return False, (f"compiled {compiled:.3f} s/step against eager {eager:.3f} "
                       f"({ratio:.2f}x, under {MARGIN}x): eager")
    if saved <= cost:
        return False, (f"compiled {ratio:.2f}x eager, but {micro_steps} steps save {saved:.0f} s"
                       f" against {cost:.0f} s of compiling: eager")
    return True, (f"compiled {ratio:.2f}x eager ({compiled:.3f} against {eager:.3f} s/step); "
                  f"{micro_steps} steps save {saved:.0f} s against {cost:.0f} s of compiling")


def choose(config, micro_tokens: int, micro_steps: int, precision: str, accelerator: str,
           cache: Path | None, timer=None, model: str = "this model") -> tuple[bool, dict[str, Any]]:
    """(whether to compile, how it was chosen) for ``config``'s ``train.compile``; ``auto`` times
    ``config``'s model (named ``model`` in the answer) unless ``cache`` has its timings."""
    asked = config.train.compile
    if asked != "off" and _torch_version(torch.__version__) < OLDEST_TORCH:
        oldest = ".".join(map(str, OLDEST_TORCH))
        return False, {"asked": asked, "how": f"torch {torch.__version__} is older than "
                       f"{oldest}, the oldest the fast path has trained on: eager"}
    if asked != "auto":
        return asked == "on", {"asked": asked, "how": "set in the config"}
    device = _device(accelerator)

    def measure() -> dict[str, Any]:
        try:
            timed = (timer or step_time.seconds_compiled)(
                config, micro_tokens, precision, "cuda" if accelerator == "gpu" else "cpu")
        except Exception as e:  # noqa: BLE001 - any compiler failure: eager, in one line
            timed = {"failed": one_line(e)}
        return {**timed, "device": device, "timed_model": model, "tokens": micro_tokens}

    known, cached = timings.measured(cache, _key(config, micro_tokens, precision, device),
                                       measure)
    chosen, how = decide(known, micro_steps)
    return chosen, {"asked": asked, "chosen": chosen, "how": how, "seconds": known,
                    "micro_steps": micro_steps, "cached": cached}


def choose_compile(run: PlannedRun, precision: str, layout: Layout = ONE_DEVICE,
                   say: bool = True) -> tuple[bool, dict[str, Any]]:
    """Whether ``run`` trains compiled on ``layout``, and how that was chosen (``choose``, timing
    its table's base at the scale as ``precision.choose_precision`` does, with one rank's
    micro-batch and threads); with ``say``, one line when ``auto`` decided."""
    c = run.config
    reference, model = c, "this model"
    if run.precision_from is not None:
        reference = run.precision_from.overrides(compile=c.train.compile)
        model = f"{run.table}'s base at `{run.scale}`"
    accumulate, micro = reference.train.split_batch(layout.world)
    with threads_of_one_rank(layout):
        chosen, how = choose(reference, micro, c.train.train_steps * accumulate, precision,
                             layout.accelerator, runs_dir() / timings.TIMINGS, model=model)
    if say and c.train.compile != "off" and "cached" not in how and not chosen:  # torch too old
        log.warning("%s: compile %s -> off (%s)", run.run_id, c.train.compile, how["how"])
    elif say and c.train.compile == "auto":
        log.info("%s: compile auto -> %s, for %s (%s%s)", run.run_id, "on" if chosen else "off",
                 model, "cached: " if how["cached"] else "", how["how"])
    return chosen, how


def cuda_graphs_refusal(c: Config, compiled: bool, layout: Layout) -> str | None:
    """Why ``train.cuda_graphs`` cannot be used as ``c`` asks, in one line, or None. It acts
    only on the fast path (``compiled``) on a GPU: elsewhere it is no error, and nothing. There,
    exact batch widths (``train.batch_shapes`` 0) record a graph again for every new shape
    (pytorch/pytorch#188150), more than one pass a step fails at the second backward
    (pytorch/pytorch#169545), and over several devices a pass whose capture failed in the
    backward cannot be taken again (DDP's gradient hooks have fired: ``lit.backward``)."""
    if not (c.train.cuda_graphs and compiled and layout.accelerator == "gpu"):
        return None
    passes = c.train.split_batch(layout.world)[0] if c.train.device_batch_tokens != "auto" else 1
    if not c.train.batch_shapes:
        return ("train.cuda_graphs with exact batch widths (train.batch_shapes 0) records a CUDA "
                "graph for every new shape: set train.batch_shapes (e.g. 8), or cuda_graphs false")
    if layout.world > 1:
        return (f"train.cuda_graphs on {layout.world} devices: a pass whose CUDA graph fails in "
                "the backward cannot be taken again under DDP; one device, or cuda_graphs false")
    if passes > 1:
        return (f"train.cuda_graphs with {passes} passes a step (train.device_batch_tokens "
                f"{c.train.device_batch_tokens} of {c.train.batch_tokens}) fails at the second "
                "backward: one pass a step (device_batch_tokens 0, or auto where it fits), or "
                "cuda_graphs false")
    return None
