"""``precision: auto``: fp32 or bf16 mixed precision, chosen by timing a training step.

A matmul alone misleads on CPUs: a bf16 matmul can run several times fp32 while a whole training
step in bf16-mixed runs slower (the casts, the fp32 loss and optimizer, the small attention
products). So on a CPU whose bf16 matmuls are not slower than fp32, a few steps of the model, on
a micro-batch of its size, are timed both ways with the threads the run will use
(``step_time``); bf16-mixed is taken if it is ``BF16_MARGIN`` faster. The model timed is the
table's base at the run's scale, not each variant's own: one precision per table and scale, so
a row's variants differ only in what the row varies. The answer is cached per machine, thread
count and model shape (``runs/timings.json``, ``timings.measured``), and both timings go into the record.
Once a table has records at a scale, they decide: its later runs there train in the precision
those trained in (``records.precision_history.settled``), whatever this machine would choose, lest a
section started in fp32 get variants in bf16 on another machine, which puts precision into the
gaps. On CUDA: bf16-mixed where the GPU supports it. A CPU whose bf16 matmul is slower than fp32
(no native bf16) trains in fp32 without timing a step. Measurements: docs/devices.md.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from reproduce.config import Config
from reproduce.paths import results_dir, runs_dir
from reproduce.records.precision_history import settled
from reproduce.records.sweep import PlannedRun
from reproduce.train import timings
from reproduce.train.devices import ONE_DEVICE, Layout, threads_of_one_rank
from reproduce.util.machine import cpu_flags, cpu_name, matmul_gflops

log = logging.getLogger("reproduce")

# bf16 rounds more: it must be this much faster per step to be taken (a near tie stays fp32, so a
# table's variants do not flip between precisions on timing noise).
BF16_MARGIN = 1.1


def bf16_matmul_not_slower() -> bool:
    """A screen, not the choice: whether timing a bf16 training step here is worth it."""
    rates = [matmul_gflops(dtype, 256, budget=0.05) for dtype in (torch.bfloat16, torch.float32)]
    return rates[0] >= rates[1]


def _key(config: Config, tokens: int, threads: int) -> str:
    return (f"precision|{cpu_name()}|{','.join(cpu_flags())}|torch {torch.__version__}|"
            f"{threads}t|{timings.shape_key(config, tokens)}")


_read = timings.read_timings


def choose(config: Config, micro_tokens: int, cache: Path | None,
           timer=None, model: str = "this model") -> tuple[str, dict[str, Any]]:
    """(the precision to train ``config`` with, how it was chosen). ``config.train.precision`` other
    than ``auto`` is taken as it is. ``model`` names the timed model in the answer."""
    asked = config.train.precision
    if asked != "auto":
        return asked, {"asked": asked, "how": "set in the config"}
    if torch.cuda.is_available():
        chosen = "bf16-mixed" if torch.cuda.is_bf16_supported() else "32-true"
        return chosen, {"asked": asked, "how": f"CUDA ({torch.cuda.get_device_name(0)}): "
                        + ("supports bf16" if chosen != "32-true" else "no bf16 support")}
    threads = torch.get_num_threads()

    def measure() -> dict[str, Any]:
        entry: dict[str, Any]
        if not bf16_matmul_not_slower():
            entry = {"chosen": "32-true", "asked": asked, "how": "bf16 matmul slower than fp32 "
                     "here (no native bf16): fp32 without timing a step", "seconds_per_step": None}
        else:
            # imported here: torch's compiler comes with it (~2.4 s of a core), which a
            # command that only prices runs (status, a dry run) never needs
            from reproduce.train import step_time

            seconds = (timer or step_time.seconds_by_precision)(config, micro_tokens)
            fast = seconds["32-true"] >= BF16_MARGIN * seconds["bf16-mixed"]
            entry = {"chosen": "bf16-mixed" if fast else "32-true", "asked": asked,
                     "how": f"timed training steps of {model} ({micro_tokens} tokens, {threads} "
                            f"thread(s)); bf16-mixed taken if {BF16_MARGIN}x faster",
                     "seconds_per_step": seconds}
        return {**entry, "cpu": cpu_name(), "cpu_flags": cpu_flags(), "threads": threads}

    entry, cached = timings.measured(cache, _key(config, micro_tokens, threads), measure)
    return entry["chosen"], {**entry, "cached": cached}


def timed(config: Config, threads: int, cache: Path | None = None) -> dict[str, Any] | None:
    """What ``choose`` cached for ``config``'s model on this machine at ``threads``, if anything."""
    micro = config.train.split_batch(1)[1]
    return _read(cache or runs_dir() / timings.TIMINGS).get(_key(config, micro, threads))


def step_ratio(choice: dict[str, Any] | None) -> float:
    """A training step's time in the precision ``choice`` took over its time in fp32, by the
    choice's own timings (a record's ``precision_choice``, or ``timed``); 1.0 for fp32, or when
    nothing was timed."""
    seconds = (choice or {}).get("seconds_per_step") or {}
    if (choice or {}).get("chosen") != "bf16-mixed" or not seconds.get("32-true"):
        return 1.0
    return seconds["bf16-mixed"] / seconds["32-true"]


def resolve_precision(precision: str, config: Config | None = None) -> str:
    """``auto``: bf16 mixed precision where it trains faster, else fp32. With ``config``, the
    answer ``precision.choose`` cached for its model on this machine, if any; a training run
    itself calls ``choose``, which times the step when nothing is cached. Without one (or nothing
    cached), a bf16 matmul no slower than fp32 counts as bf16: a guess, for estimates only."""
    if precision != "auto":
        return precision
    if torch.cuda.is_available():
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "32-true"
    if config is not None:
        known = timed(config, torch.get_num_threads())
        if known:
            return known["chosen"]
    return "bf16-mixed" if bf16_matmul_not_slower() else "32-true"


def choose_precision(run: PlannedRun, layout: Layout = ONE_DEVICE) -> tuple[str, dict[str, Any]]:
    """The precision ``run`` trains with on ``layout`` and how it was chosen (``precision.choose``:
    for ``auto`` on a CPU, a timed fp32 and bf16-mixed step of its table's base model at the
    scale, or of its own model where it has no table, at the micro-batch and threads of one rank,
    cached)."""
    c = run.config
    # One precision for a table at a scale: timing each variant's own model let a variant whose
    # matmuls are larger (A1: one head of 128) train in bf16 beside fp32 variants, so the row
    # measured precision along with heads. The spec's base decides for all of them.
    reference, model = c, "this model"
    if run.precision_from is not None:
        reference = run.precision_from.overrides(precision=c.train.precision)
        model = f"{run.table}'s base at `{run.scale}` (one precision for all its variants)"
    micro = reference.train.split_batch(layout.world)[1]
    with threads_of_one_rank(layout):
        precision, chosen = choose(reference, micro, runs_dir() / timings.TIMINGS, model=model)
    if c.train.precision == "auto":
        # Which model the timings are of, said in every record (a cached answer's "how" keeps
        # the words of the run that timed it).
        chosen = {**chosen, "timed_model": model}
        if run.precision_from is not None and (found := settled(run, results_dir())):
            # what this machine alone would take (choose's answer; on CUDA its "how" alone says it)
            here = precision
            precision, counts = found
            chosen = {**chosen, "chosen": precision, "here": here, "records": counts,
                      "how": f"as {sum(counts.values())} record(s) of {run.table} at "
                             f"`{run.scale}` trained (one precision per table and scale; "
                             f"this machine alone would take {here}: {chosen['how']})"}
            if len(counts) > 1:
                log.warning("%s: the records of %s at `%s` trained in several precisions (%s); "
                            "this run takes the most common, %s", run.run_id, run.table,
                            run.scale, ", ".join(f"{p} {n}" for p, n in sorted(counts.items())),
                            precision)
            if precision == "bf16-mixed" and not torch.cuda.is_available() \
                    and not bf16_matmul_not_slower():
                log.warning("%s: trains in bf16-mixed as its table's records at `%s` did, but "
                            "bf16 matmuls are slower than fp32 on this CPU: expect a slow run",
                            run.run_id, run.scale)
        seconds = chosen.get("seconds_per_step")
        line = (", ".join(f"{p} {s:.3f} s/step" for p, s in seconds.items()) if seconds else "")
        # A cached answer was timed by an earlier run of the same model, maybe at another scale
        # (its "how" names that one): said so, lest the line seem to time another model.
        how = (f"cached from an earlier run of the same model: {chosen['how']}"
               if chosen.get("cached") and "records" not in chosen else chosen["how"])
        log.info("%s: precision auto -> %s, for %s%s (%s)", run.run_id, precision, model,
                 f": {line}" if line else "", how)
    return precision, chosen
