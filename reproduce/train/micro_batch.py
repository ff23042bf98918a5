"""``train.device_batch_tokens: auto``: each device's micro-batch chosen from measured memory.

A step's tokens (``batch_tokens`` over the devices) go through in one pass where they fit, else
in the fewest equal micro-batches that do, accumulated. Fewer passes issue fewer kernels: a GPU
step bound by the host issuing them (``results/gpu.md``) is shorter for each pass saved.

On a GPU it is measured: one training step (forward, loss, backward, Adam) of the run's model in
its precision, at the widest batch a run can have (every pair ``max_tokens_per_sentence`` long on
both sides: the most padding and the longest attention), on the micro-batch tried, one pass
first, then two, three, ... equal ones; the first whose peak memory stays within ``HEADROOM`` of
the device's is taken (a pass that runs out of memory counts as not fitting). The answer is
cached per GPU, torch version, precision and model shape (``runs/micro-batch.json``), so every
rank of a run, and every later run on such a GPU, reads the same. A CPU takes one pass (its memory
is not what limits a step at the scales a CPU trains). The record keeps how
(``batch.micro_batch_choice``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from reproduce.config import Config
from reproduce.errors import ConfigError
from reproduce.paths import runs_dir
from reproduce.records.sweep import PlannedRun
from reproduce.train.devices import Layout
from reproduce.util.files import write_atomic

log = logging.getLogger("reproduce")

AUTO = "auto"
CACHE = "micro-batch.json"
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
            return passes, tokens, tried
    raise ConfigError(f"train.device_batch_tokens = auto: {per_device} tokens a step do not fit "
                      f"this device's memory ({total / 2**30:.1f} GiB) in {MOST_PASSES} passes; "
                      "lower train.batch_tokens or train on more devices")


def cuda_peak(config: Config, precision: str) -> Callable[[int], int | None]:
    """``peak(tokens)``: the peak bytes allocated on the current GPU by one training step of
    ``config``'s model in ``precision`` on ``tokens`` tokens of the widest batch; None where it
    ran out of memory."""
    from reproduce.paper.model import Transformer
    from reproduce.paper.optim import adam_with_schedule
    from reproduce.train.step_time import step_loss

    c, width = config, config.train.max_tokens_per_sentence
    dtype = torch.bfloat16 if precision.startswith("bf16") else torch.float16
    autocast = precision.endswith("-mixed")

    def peak(tokens: int) -> int | None:
        rows = max(1, tokens // width)
        model = optimizer = batch = None
        try:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            model = Transformer(c.model).cuda()
            optimizer, _ = adam_with_schedule(model.parameters(), c.train, c.model.d_model)
            ids = torch.randint(4, c.model.vocab_size, (3, rows, width), device="cuda")
            batch = {"src": ids[0], "tgt_in": ids[1], "tgt_out": ids[2]}
            with torch.autocast("cuda", dtype=dtype, enabled=autocast):
                loss = step_loss(model, batch, c.train.eps_ls, c.model.pad_id)
            loss.backward()
            optimizer.step()
            torch.cuda.synchronize()
            return int(torch.cuda.max_memory_allocated())
        except torch.OutOfMemoryError:
            return None
        finally:
            del model, optimizer, batch
            torch.cuda.empty_cache()
    return peak


def choose(config: Config, devices: int, precision: str, accelerator: str, cache: Path | None,
           peak: Callable[[int], int | None] | None = None, total: int | None = None
           ) -> tuple[int, dict[str, Any]]:
    """The tokens of a device's micro-batch for ``config`` (``device_batch_tokens`` as set, or
    chosen for ``auto``) and how it was chosen."""
    asked = config.train.device_batch_tokens
    per_device = -(-config.train.batch_tokens // devices)
    if asked != AUTO:
        return config.train.split_batch(devices)[1], {"asked": asked, "how": "set in the config"}
    if accelerator != "gpu" and peak is None:
        return per_device, {"asked": AUTO, "how": "one pass a step: a CPU's memory is not measured"}
    from reproduce.train import step_time

    device = torch.cuda.get_device_name() if peak is None else "given"
    m = config.model
    key = (f"{device}|torch {torch.__version__}|{precision}|"
           f"{step_time.shape_key(config, per_device)}|width {config.train.max_tokens_per_sentence}")
    known = step_time.read_timings(cache).get(key) if cache else None
    cached = known is not None
    if known is None:
        if total is None:
            total = torch.cuda.get_device_properties(0).total_memory
        passes, tokens, tried = fewest_passes(per_device, peak or cuda_peak(config, precision),
                                              total)
        known = {"passes": passes, "tokens": tokens, "total_bytes": total,
                 "peak_bytes": {str(k): v for k, v in tried.items()}, "device": device,
                 "model": f"N{m.N} d_model {m.d_model}"}
        if cache:
            write_atomic(cache, (json.dumps({**step_time.read_timings(cache), key: known},
                                            indent=1) + "\n").encode())
    peaks = known["peak_bytes"]
    how = (f"{known['passes']} pass(es) of {known['tokens']} tokens a step: peak "
           f"{peaks[str(known['tokens'])] / 2**30:.1f} GiB of {known['total_bytes'] / 2**30:.1f} "
           f"(at most {HEADROOM:.0%}), measured on the widest batch")
    return known["tokens"], {"asked": AUTO, "how": how, "measured": known, "cached": cached}


def resolve(run: PlannedRun, layout: Layout, precision: str) -> PlannedRun:
    """``run`` with its micro-batch chosen (``choose``) where it asks ``auto``, as a number, and
    how in ``micro_batch_choice``; as it is otherwise."""
    if run.config.train.device_batch_tokens != AUTO:
        return run
    tokens, how = choose(run.config, layout.world, precision, layout.accelerator,
                         runs_dir() / CACHE)
    log.info("%s: device_batch_tokens auto -> %d (%s%s)", run.run_id, tokens,
             "cached: " if how.get("cached") else "", how["how"])
    reference = run.precision_from
    return replace(run, config=run.config.overrides(device_batch_tokens=tokens),
                   precision_from=reference and reference.overrides(device_batch_tokens=tokens),
                   micro_batch_choice=how)
