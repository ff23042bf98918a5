"""Table 3's parameter column at the paper's sizes: each variant's model built on the meta device
(no weights allocated) and counted, beside the paper's printed figure."""

from __future__ import annotations

from typing import Any

from reproduce.config import ModelConfig, model_items
from reproduce.paper.model import build_on_meta, count_parameters
from reproduce.records.sweep import Spec


def shape_row(m: ModelConfig) -> dict[str, Any]:
    """A model's fields that change its parameters (``config.model_items``: shapes and sizes) and
    its exact parameter count, the model built on the meta device."""
    return {**dict(model_items(m, ("shape", "size"))),
            "params": count_parameters(build_on_meta(m))}


def parameter_rows(spec: Spec, vocab_size: int, scale: str = "paper") -> list[dict[str, Any]]:
    """One row per variant: its shape, our exact parameter count (model built on the meta device,
    no weights allocated) and the paper's printed figure in millions (None where not printed)."""
    rows = []
    for name in spec.variants:
        config = spec.resolve(name, scale).overrides(vocab_size=vocab_size)
        rows.append({"variant": name, **shape_row(config.model)})
        rows[-1]["paper_params_m"] = spec.variants[name].paper.get("params_m")
    return rows
