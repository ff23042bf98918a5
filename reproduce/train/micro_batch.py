"""``train.device_batch_tokens: auto``: each device's micro-batch chosen from measured memory.

A step's tokens (``batch_tokens`` over the devices) go through in one pass where they fit, else
in the fewest equal micro-batches that do, accumulated. Fewer passes issue fewer kernels: a GPU
step bound by the host issuing them (``results/gpu.md``) is shorter for each pass saved.

On a GPU it is measured: one eager training step (forward, loss, backward, Adam) of the run's
model in its precision, at the widest batch a run can have (every pair
``max_tokens_per_sentence`` long on both sides: the most padding and the longest attention), on
the micro-batch tried, one pass first, then two, three, ... equal ones; the first whose peak
(memory torch reserved) stays within ``HEADROOM`` of what the GPU had free is taken (a pass that
runs out of memory counts as not fitting). Answers are cached per GPU, torch version, precision
and model (shape and dropout, which keeps its masks) in ``runs/timings.json``
(``timings.measured``), and a run keeps its own in its folder (``RUN_FILE``): a resumed run,
and a cluster's other ranks (which read it once rank 0 has decided), take the micro-batch it
started with. A GPU shared with other
processes when measured gives a smaller answer; one shared later than measured can run out of
memory (one line says what to lower). A CPU takes one pass (its memory is not what limits a step
at the scales a CPU trains). The record keeps how (``batch.micro_batch_choice``)."""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from reproduce.config import Config, model_identity
from reproduce.errors import ConfigError
from reproduce.paths import runs_dir
from reproduce.records.sweep import PlannedRun
from reproduce.train import step_time, timings
from reproduce.train.devices import Layout
from reproduce.util.files import write_atomic

log = logging.getLogger("reproduce")

AUTO = "auto"
RUN_FILE = "micro-batch.json"  # in the run's folder: the micro-batch it started with
# How the peaks were measured; a cache entry of another method is measured again
METHOD = 1
HEADROOM = 0.85  # of the device's memory a probed step's peak may take: room for fragmentation
MOST_PASSES = 64  # a step split further than this is refused: lower batch_tokens or add devices


def fewest_passes(per_device: int, peak: Callable[[int], int | None], total: int
                  ) -> tuple[int, int, dict[int, int | None]]:
    """(passes, tokens a pass, {tokens: peak bytes or None where it ran out}) for a device's
    ``per_device`` tokens a step: the fewest equal passes whose ``peak(tokens)`` is within
    ``HEADROOM`` of ``total`` bytes."""
    tried: dict[int, int | None] = {}
    for passes in range(1, MOST_PASSES + 1):
        tokens = -(-per_device // passes)
        if tokens in tried:
            continue
        tried[tokens] = measured = peak(tokens)
        if measured is not None and measured <= HEADROOM * total:
            return -(-per_device // tokens), tokens, tried  # the passes accumulation makes
    raise ConfigError(f"train.device_batch_tokens = auto: {per_device} tokens a step do not fit "
                      f"this device's memory ({total / 2**30:.1f} GiB) in {MOST_PASSES} passes; "
                      "lower train.batch_tokens or train on more devices")


def cuda_peak(config: Config, precision: str) -> Callable[[int], int | None]:
    """``peak(tokens)``: the peak bytes torch reserved on the current GPU for one eager training
    step of ``config``'s model in ``precision`` on ``tokens`` tokens of the widest batch; None
    where it ran out of memory. Everything it allocated is freed before it returns."""
    from reproduce.paper.model import Transformer
    from reproduce.paper.optim import adam_with_schedule

    c, width = config, config.train.max_tokens_per_sentence
    dtype = torch.bfloat16 if precision.startswith("bf16") else torch.float16
    autocast = precision.endswith("-mixed")
    half = precision.endswith("-true") and not precision.startswith("32")

    def step(tokens: int) -> int:
        model = Transformer(c.model).cuda()
        if half:
            model = model.to(dtype)
        optimizer, _ = adam_with_schedule(model.parameters(), c.train, c.model.d_model)
        ids = torch.randint(4, c.model.vocab_size, (3, max(1, tokens // width), width),
                            device="cuda")
        with torch.autocast("cuda", dtype=dtype, enabled=autocast):
            loss = step_time.step_loss(model, {"src": ids[0], "tgt_in": ids[1], "tgt_out": ids[2]},
                             c.train.eps_ls, c.model.pad_id)
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_reserved())

    def peak(tokens: int) -> int | None:
        torch.cuda.reset_peak_memory_stats()
        try:
            return step(tokens)  # its tensors are gone once it returns
        except torch.OutOfMemoryError:
            return None
        finally:
            gc.collect()
            torch.cuda.empty_cache()
    return peak


def free_bytes() -> int:
    """What the current GPU has free for this process: its free memory (others' use counted)
    plus what this process's torch holds and could hand back."""
    gc.collect()
    torch.cuda.empty_cache()
    return int(torch.cuda.mem_get_info()[0]) + int(torch.cuda.memory_reserved())


def cache_key(config: Config, tokens: int, precision: str, device: str) -> str:
    """What a measured micro-batch is of: the device, torch, precision, the model's shapes and
    dropouts (what a step keeps in memory) at ``tokens``, the widest sentence and the method."""
    return (f"micro-batch|{device}|torch {torch.__version__}|{precision}|"
            f"{timings.shape_key(config, tokens, ('shape', 'dropout'))}|"
            f"width {config.train.max_tokens_per_sentence}|method {METHOD}")


def choose(config: Config, devices: int, precision: str, accelerator: str, cache: Path | None,
           peak: Callable[[int], int | None] | None = None, total: int | None = None
           ) -> tuple[int, dict[str, Any]]:
    """The tokens of a device's micro-batch for ``config`` (``device_batch_tokens`` as set, or
    chosen for ``auto``) and how it was chosen; ``peak`` and ``total`` (bytes free) stand for a
    GPU's (``cuda_peak``, ``free_bytes``)."""
    asked = config.train.device_batch_tokens
    per_device = config.train.split_batch(devices)[1]  # auto, before measuring: one pass
    if asked != AUTO:
        return per_device, {"asked": asked, "how": "set in the config"}
    if accelerator != "gpu" and peak is None:
        return per_device, {"asked": AUTO, "how": "one pass a step: a CPU's memory is not measured"}
    device = torch.cuda.get_device_name() if peak is None else "given"

    def measure() -> dict[str, Any]:
        free = free_bytes() if total is None else total
        passes, tokens, tried = fewest_passes(per_device, peak or cuda_peak(config, precision),
                                              free)
        return {"passes": passes, "tokens": tokens, "free_bytes": free,
                "peak_bytes": {str(k): v for k, v in tried.items()}, "device": device,
                "model": model_identity(config.model)}

    known, cached = timings.measured(cache, cache_key(config, per_device, precision, device),
                                       measure)
    peaks = known["peak_bytes"]
    how = (f"{known['passes']} pass(es) of {known['tokens']} tokens a step: peak "
           f"{peaks[str(known['tokens'])] / 2**30:.1f} GiB of {known['free_bytes'] / 2**30:.1f} "
           f"free (at most {HEADROOM:.0%}), measured on the widest batch")
    return known["tokens"], {"asked": AUTO, "how": how, "measured": known, "cached": cached}


def resolve(run: PlannedRun, layout: Layout, precision: str, work: Path) -> PlannedRun:
    """``run`` with its micro-batch as a number where it asks ``auto``, and how in
    ``micro_batch_choice``: the one its folder ``work`` keeps (``RUN_FILE``: it started with it,
    or rank 0 chose it), else ``choose``'s, kept there; ``run`` as it is otherwise."""
    if run.config.train.device_batch_tokens != AUTO:
        return run
    kept = work / RUN_FILE
    per_device = run.config.train.split_batch(layout.world)[1]  # one pass, before measuring
    try:
        earlier = json.loads(kept.read_text())
    except (OSError, ValueError):
        earlier = {}
    if earlier.get("per_device") == per_device:
        tokens, how = earlier["tokens"], earlier["how"]
    else:
        tokens, how = choose(run.config, layout.world, precision, layout.accelerator,
                             runs_dir() / timings.TIMINGS)
        work.mkdir(parents=True, exist_ok=True)
        write_atomic(kept, json.dumps({"per_device": per_device, "tokens": tokens,
                                       "how": how}, indent=1).encode())
        log.info("%s: device_batch_tokens auto -> %d (%s%s)", run.run_id, tokens,
                 "cached: " if how.get("cached") else "", how["how"])
    return replace(run, config=run.config.overrides(device_batch_tokens=tokens),
                   micro_batch_choice=how)
