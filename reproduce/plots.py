"""Figures rendered from run records (PNG, beside the Markdown tables in ``results/``).

Like ``results.py``, pure functions of the records: BLEU against parameters for each scale (ours
beside the paper's), and the learning curves every record carries.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from .sweep import Spec


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen
    import matplotlib.pyplot as plt

    return plt


def _by_scale(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        out[r["scale"]].append(r)
    return out


def plot_table(spec: Spec, records: list[dict[str, Any]], directory: Path) -> list[Path]:
    """Write ``<table>-<scale>.png`` per scale with records: dev BLEU against parameters (mean
    over seeds, error bars = std) next to the paper's figures, and the dev-PPL learning curves.
    Returns the files written."""
    plt = _pyplot()
    written = []
    for scale, recs in sorted(_by_scale(records).items()):
        per_variant: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in recs:
            per_variant[r["variant"]].append(r)
        fig, (ax_bleu, ax_paper, ax_curve) = plt.subplots(1, 3, figsize=(16, 4.8))
        for name, runs in per_variant.items():
            params = runs[0]["metrics"]["params"] / 1e6
            bleu = [r["metrics"]["dev_bleu"] for r in runs]
            mean = sum(bleu) / len(bleu)
            std = (sum((b - mean) ** 2 for b in bleu) / (len(bleu) - 1)) ** 0.5 if len(bleu) > 1 else 0
            ax_bleu.errorbar(params, mean, yerr=std, fmt="o", capsize=3)
            ax_bleu.annotate(name, (params, mean), textcoords="offset points", xytext=(4, 4),
                             fontsize=8)
            paper = spec.variants.get(name)
            if paper and "bleu" in paper.paper and "params_m" in paper.paper:
                ax_paper.plot(paper.paper["params_m"], paper.paper["bleu"], "s", color="grey")
                ax_paper.annotate(name, (paper.paper["params_m"], paper.paper["bleu"]),
                                  textcoords="offset points", xytext=(4, 4), fontsize=8)
            for r in runs:
                curve = r.get("curve", {}).get("dev_ppl") or []
                if curve:
                    ax_curve.plot([c[0] for c in curve], [c[2] for c in curve], marker=".",
                                  label=f"{name} s{r['seed']}")
        ax_bleu.set(title=f"ours, scale `{scale}`", xlabel="parameters (M)", ylabel="dev BLEU")
        ax_paper.set(title="paper (WMT14 EN-DE newstest2013)", xlabel="parameters (M)",
                     ylabel="dev BLEU")
        ax_curve.set(title="ours: dev PPL during training", xlabel="step", ylabel="dev PPL",
                     yscale="log")
        if ax_curve.lines:
            ax_curve.legend(fontsize=7, ncol=2)
        fig.suptitle(f"{spec.table}: {spec.caption}", fontsize=10)
        fig.tight_layout()
        path = directory / f"{spec.table}-{scale}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def plot_attention(panels: list[tuple[str, Any, list[str], list[str]]], path: Path) -> Path:
    """Attention maps for one sentence, as the paper's Figures 3-5: one row per panel (name,
    (h, L_query, L_key) weights, key labels, query labels), one image per head."""
    plt = _pyplot()
    heads = max(w.shape[0] for _, w, _, _ in panels)
    fig, axes = plt.subplots(len(panels), heads, figsize=(2.4 * heads, 2.6 * len(panels)),
                             squeeze=False)
    for row, (name, w, keys, queries) in enumerate(panels):
        for h in range(heads):
            ax = axes[row][h]
            ax.set_xticks([])
            ax.set_yticks([])
            if h >= w.shape[0]:
                ax.axis("off")
                continue
            ax.imshow(w[h].float().numpy(), cmap="Blues", vmin=0, vmax=1, aspect="auto")
            ax.set_title(f"{name} head {h + 1}", fontsize=7)
            if h == 0:
                ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=5)
                ax.set_yticks(range(len(queries)), queries, fontsize=5)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
