"""Attention maps of a trained model for one sentence, as the paper's Figures 3-5.

``python -m reproduce attention --run table3-base-cpu-seed0 [--sentence "..."]`` loads the run's
last checkpoint, translates the sentence (beam search as the run was evaluated), and draws every
head of the chosen encoder self-attention layer (default: the fifth of six, as Figure 3), the
last decoder layer's attention over the source, and the decoder's self-attention, to
``results/attention-<run_id>.png``.

The model computes attention with torch's fused kernel, which returns no weights; here forward
hooks keep each attention module's inputs and the weights are recomputed from its own
projections: softmax(Q K^T / sqrt(d_k)) with the same masks.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from reproduce.data.source import CorpusSource
from reproduce.data.vocabulary import tokenizer_path
from reproduce.errors import DataError
from reproduce.paper.decoding import beam_search
from reproduce.paper.model import MultiHeadAttention, Transformer
from reproduce.paper.tokenizer import load_tokenizer
from reproduce.tables.figures import pyplot
from reproduce.train.lit import TranslationModule

DEFAULT_SENTENCE = ("In the beginning was the Word, and the Word was with God, and the Word was "
                    "God.")


def attention_weights(model: Transformer, src: Tensor, tgt_in: Tensor) -> dict[str, list[Tensor]]:
    """Teacher-forced weights of one sentence (batch of 1): for each of "encoder self",
    "decoder self" and "decoder cross", one (h, L_query, L_key) tensor per layer."""
    captured: list[tuple[MultiHeadAttention, tuple, dict]] = []

    def keep(module, args, kwargs):
        captured.append((module, args, kwargs))

    hooks = [m.register_forward_pre_hook(keep, with_kwargs=True)
             for m in model.modules() if isinstance(m, MultiHeadAttention)]
    try:
        model.eval()
        with torch.no_grad():
            model(src, tgt_in)
            out: dict[str, list[Tensor]] = {"encoder self": [], "decoder self": [],
                                            "decoder cross": []}
            for module, args, kwargs in captured:
                x_q, x_kv = args[0], args[1]
                mask = args[2] if len(args) > 2 else kwargs.get("mask")
                causal = args[3] if len(args) > 3 else kwargs.get("is_causal", False)
                q = module.project_q(x_q)
                k, _ = module.project_kv(x_kv)
                scores = q @ k.transpose(-1, -2) / math.sqrt(module.d_k)
                if mask is not None:
                    scores = scores.masked_fill(~mask, float("-inf"))
                if causal:
                    L, S = scores.shape[-2:]
                    future = torch.ones(L, S, dtype=torch.bool, device=scores.device).triu(1)
                    scores = scores.masked_fill(future, float("-inf"))
                weights = scores.softmax(-1)[0]
                if module in {layer.self_attn for layer in model.encoder}:
                    out["encoder self"].append(weights)
                elif module in {layer.self_attn for layer in model.decoder}:
                    out["decoder self"].append(weights)
                else:
                    out["decoder cross"].append(weights)
    finally:
        for h in hooks:
            h.remove()
    return out


def _no_checkpoint(run_id: str, ckpt: Path, results: Path) -> str:
    """Why there is nothing to draw, in one line: where a record of the run exists (a clone holds
    records, never checkpoints), how to train it into a folder of one's own and draw from there."""
    record = next(results.glob(f"*/{run_id}.json"), None)
    if record is None:
        return f"{ckpt}: no checkpoint and no record of run {run_id!r} (runs are under {ckpt.parents[3]})"
    r = json.loads(record.read_text())
    table = r["table"] if r["table"] in ("table2", "table3", "table4") else \
        f"table3 --spec sweeps/{r['table']}.yaml"
    return (f"{run_id}: its record is here ({record}), its checkpoints are not ({ckpt}): records "
            "are committed, checkpoints are not. Train it into a folder of your own, then draw "
            f"from there: python -m reproduce {table} --variant {r['variant']} --scale "
            f"{r['scale']} --seeds {r['seed']} --results mine && python -m reproduce attention "
            f"--run {run_id} --results mine")


def draw(run_id: str, sentence: str | None, layer: int | None, results: Path, runs: Path) -> Path:
    """Load a finished or running run's last checkpoint and write its attention figure."""
    table = run_id.split("-", 1)[0]
    ckpt = runs / table / run_id / "checkpoints" / "last.ckpt"
    if not ckpt.is_file():
        raise DataError(_no_checkpoint(run_id, ckpt, results))
    module = TranslationModule.load_from_checkpoint(ckpt, map_location="cpu")
    c = module.config
    source = CorpusSource(c.data.corpus, c.data.data_dir or None, c.data.extra_trees or None,
                          c.data.linearization)
    tokenizer = load_tokenizer(tokenizer_path(source, c.model.vocab_size, kind=c.data.vocabulary))
    model = module.model.eval()
    ids = tokenizer.encode([sentence or DEFAULT_SENTENCE])[0] + [tokenizer.eos_id]
    src = torch.tensor([ids])
    with torch.no_grad():
        out = beam_search(model, src, tokenizer.bos_id, tokenizer.eos_id, c.decode.beam,
                          c.decode.alpha, c.decode.max_len_offset)[0]
    tgt_in = torch.tensor([[tokenizer.bos_id] + out])
    weights = attention_weights(model, src, tgt_in)
    pieces = [tokenizer.piece(i) for i in ids[:-1]] + ["</s>"]
    target = ["<s>"] + [tokenizer.piece(i) for i in out]
    n = len(weights["encoder self"])
    layer = min(layer or max(n - 1, 1), n)  # 1-based; Figure 3 shows layer 5 of 6
    panels = [(f"encoder self L{layer}", weights["encoder self"][layer - 1], pieces, pieces),
              (f"decoder cross L{n}", weights["decoder cross"][-1], pieces, target),
              (f"decoder self L{n}", weights["decoder self"][-1], target, target)]
    path = results / f"attention-{run_id}.png"
    plot_attention(panels, path)
    translation = tokenizer.decode([out])[0]
    print(f"{run_id}: {sentence or DEFAULT_SENTENCE!r} -> {translation!r}")
    return path


def plot_attention(panels: list[tuple[str, Any, list[str], list[str]]], path: Path) -> Path:
    """Attention maps for one sentence, as the paper's Figures 3-5: one row per panel (name,
    (h, L_query, L_key) weights, key labels, query labels), one image per head."""
    plt = pyplot()
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
