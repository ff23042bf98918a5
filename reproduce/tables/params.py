"""Table 3's parameter column at the paper's sizes: each variant's model built on the meta device
(no weights allocated) and counted, beside the paper's printed figure."""

from __future__ import annotations

from typing import Any

from reproduce.paper.model import build_on_meta, count_parameters
from reproduce.records.sweep import Spec


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
