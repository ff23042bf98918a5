"""What a configuration costs: parameter counts (Table 3's column) and a measured training step
here (how ``--workers`` balances runs between its workers; plans use ``estimates``)."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from reproduce.config import Config
from reproduce.paper.model import Transformer, build_on_meta, count_parameters
from reproduce.paper.optim import accumulation, output_loss
from reproduce.runs.sweep import Spec
from reproduce.train.precision import resolve_precision


def parameter_rows(spec: Spec, vocab_size: int, scale: str = "paper") -> list[dict[str, Any]]:
    """One row per variant: its shape, our exact parameter count (model built on the meta device,
    no weights allocated) and the paper's printed figure in millions (None where not printed)."""
    rows = []
    for name in spec.variants:
        config = spec.resolve(name, scale).overrides(vocab_size=vocab_size)
        m = config.model
        rows.append({
            "variant": name, "N": m.N, "d_model": m.d_model, "d_ff": m.d_ff, "h": m.h,
            "d_k": m.d_k, "d_v": m.d_v, "positions": m.positions, "vocab_size": vocab_size,
            "params": count_parameters(build_on_meta(m)),
            "paper_params_m": spec.variants[name].paper.get("params_m"),
        })
    return rows


def measure_step_seconds(config: Config, tokens: int, sentence_length: int = 25,
                         repeats: int = 1, precision_of: Config | None = None) -> float:
    """Seconds for one forward + backward + Adam step on `tokens` source (and target) tokens of
    synthetic sentences, on this machine's default device (no data, no network), in the precision
    chosen for ``precision_of`` (the run's table base; default ``config``)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    m = config.model
    model = Transformer(m).to(device)
    optimizer = torch.optim.Adam(model.parameters())
    B = max(1, tokens // sentence_length)
    src = torch.randint(4, m.vocab_size, (B, sentence_length), device=device)
    autocast = torch.autocast(device, dtype=torch.bfloat16,
                              enabled=resolve_precision(config.train.precision,
                                                        precision_of or config).startswith("bf16"))
    times = []
    for _ in range(repeats + 1):  # the first step warms up
        start = time.perf_counter()
        with autocast:
            loss, _ = output_loss(model.features(src, src), model.embed.weight, src,
                                  config.train.eps_ls, m.pad_id)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
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
    accumulate, micro = accumulation(t.batch_tokens, t.device_batch_tokens, devices)
    probe = min(probe_tokens, micro)
    small = measure_step_seconds(config, probe, repeats=3, precision_of=precision_of)
    per_micro = small
    if probe < micro:
        second = min(2 * probe, micro)
        slope = max(measure_step_seconds(config, second, repeats=3, precision_of=precision_of)
                    - small, 0.0) / (second - probe)
        per_micro = small + slope * (micro - probe)
    return per_micro * accumulate
