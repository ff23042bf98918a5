"""A measured training step of a config on this machine: how ``--workers`` balances runs
between its workers (plans use the cost model of ``plan.estimates`` instead)."""

from __future__ import annotations

import statistics
import time

import torch

from reproduce.config import Config
from reproduce.paper.model import Transformer
from reproduce.paper.optim import adam_with_schedule
from reproduce.train.precision import resolve_precision
from reproduce.train.step_time import synthetic_batch, train_step


def measure_step_seconds(config: Config, tokens: int, sentence_length: int = 25,
                         repeats: int = 1, precision_of: Config | None = None) -> float:
    """Seconds for one forward + backward + Adam step (``step_time.train_step``) on ``tokens``
    per side of synthetic sentences, on this machine's default device (no data, no network), in
    the precision chosen for ``precision_of`` (the run's table base; default ``config``)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    m = config.model
    model = Transformer(m).to(device).train()
    optimizer, schedule = adam_with_schedule(model.parameters(), config.train, m.d_model)
    batch = {k: v.to(device) for k, v in synthetic_batch(m.vocab_size, tokens,
                                                          sentence_length).items()}
    precision = resolve_precision(config.train.precision, precision_of or config)
    times = []
    for _ in range(repeats + 1):  # the first step warms up
        start = time.perf_counter()
        train_step(model, optimizer, schedule, batch, config, precision)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def step_seconds(config: Config, probe_tokens: int = 256, devices: int = 1,
                 precision_of: Config | None = None) -> float:
    """Seconds one training step of ``config`` should take here on ``devices``: steps measured on
    micro-batches of ``probe_tokens`` and twice that, extrapolated along the line through them to
    the real micro-batch, times the accumulated micro-batches per step (precision as in
    ``measure_step_seconds``)."""
    t = config.train
    accumulate, micro = t.split_batch(devices)
    probe = min(probe_tokens, micro)
    small = measure_step_seconds(config, probe, repeats=3, precision_of=precision_of)
    per_micro = small
    if probe < micro:
        second = min(2 * probe, micro)
        slope = max(measure_step_seconds(config, second, repeats=3, precision_of=precision_of)
                    - small, 0.0) / (second - probe)
        per_micro = small + slope * (micro - probe)
    return per_micro * accumulate
