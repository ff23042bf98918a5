"""How many shapes an epoch's training batches take, and how much of them is padding, with exact
widths and with ``train.batch_shapes`` fitted shapes (``reproduce.data.batching.Shapes``).

    python benchmarks/batch_shapes.py [--counts 8 16 24 32] [--out results/batch-shapes.md]

Three length mixes, each the training pairs' model-side lengths (pieces + EOS or BOS), an epoch
planned with seed 1 on one rank, nothing trained:

* ``cpu``: Bible EN-DE with the `cpu` scale's BPE (8000 pieces), pairs of at most 128 tokens,
  2048 tokens a batch;
* ``paper``: Bible EN-DE with the paper's EN-DE vocabulary (37000 pieces), at most 256 tokens,
  12,500 tokens a micro-batch (the `paper` scale's two passes a step before
  ``device_batch_tokens: auto``);
* ``paper, WMT-sized``: 4,500,000 pairs (WMT14 EN-DE's count) drawn as
  ``benchmarks/data_scale.py`` draws its WMT-sized corpus (each pair one training verse or two
  consecutive ones, seed 0), their lengths added: a wider mix, nearer WMT's (whose files this
  machine cannot fetch), and as many batches an epoch as the paper's run has.

For each: batches an epoch, distinct shapes (rows, source width, target width), the share of the
tensors' positions that are padding (both sides, then the target alone, which the loss sees) and
the mean padded tokens a batch, exact and with each count of shapes. Writes a Markdown report and
its JSON beside it.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from reproduce.config import Config
from reproduce.data.batching import Shapes, batch_by_shapes, batch_by_tokens, shape_census
from reproduce.speed.report import environment
from reproduce.train.fit import build_data

ROOT = Path(__file__).resolve().parent.parent
WMT14_EN_DE_PAIRS = 4_500_000
MIXES = {"cpu": (8000, 128, 2048, 0), "paper": (37000, 256, 12500, 0),
         "paper, WMT-sized": (37000, 256, 12500, WMT14_EN_DE_PAIRS)}


def lengths_of(vocab: int, longest: int, drawn: int) -> np.ndarray:
    """The Bible EN-DE training pairs' model-side lengths at ``vocab`` pieces, at most
    ``longest`` tokens a side (as a run drops longer ones); ``drawn`` > 0: that many pairs of one
    verse or two consecutive ones, drawn as ``benchmarks/data_scale.py`` draws them."""
    config = Config().overrides(corpus="bible-en-de", vocab_size=vocab,
                                max_tokens_per_sentence=longest)
    _, data = build_data(config)
    data.setup()
    lengths = data._ready(data._train).lengths
    if drawn:
        assert data.dropped == 0, "the draw indexes every training verse"
        rng = random.Random(0)
        out = np.empty((drawn, 2), dtype=np.int64)
        for k in range(drawn):
            i = rng.randrange(len(lengths) - 1)
            out[k] = lengths[i] if rng.random() < 0.5 else lengths[i] + lengths[i + 1] - 1
        lengths = out
    return lengths[(lengths <= longest).all(axis=1)]


def census(batches: list[list[int]], lengths: np.ndarray) -> dict[str, float]:
    """``shape_census``, the target side's padding share and the mean padded tokens a batch."""
    widths = [getattr(b, "widths", tuple(lengths[b].max(axis=0))) for b in batches]
    tgt_real = sum(int(lengths[b][:, 1].sum()) for b in batches)
    tgt_padded = sum(len(b) * int(w[1]) for b, w in zip(batches, widths, strict=True))
    tokens = np.mean([len(b) * max(map(int, w)) for b, w in zip(batches, widths, strict=True)])
    return {**shape_census(batches, lengths), "tgt_padding_share": round(1 - tgt_real / tgt_padded, 4),
            "tokens_per_batch": round(float(tokens))}


def measure(counts: list[int]) -> list[dict]:
    rows = []
    for name, (vocab, longest, tokens, drawn) in MIXES.items():
        lengths = lengths_of(vocab, longest, drawn)
        exact = census(batch_by_tokens(lengths, tokens, True, 1), lengths)
        row = {"mix": name, "vocab": vocab, "longest": longest, "batch_tokens": tokens,
               "pairs": len(lengths), "mean_lengths": lengths.mean(axis=0).round(1).tolist(),
               "exact": exact, "shaped": {}}
        for count in counts:
            shapes = Shapes.fit(lengths, count, tokens)
            row["shaped"][count] = {**census(batch_by_shapes(lengths, shapes, True, 1), lengths),
                                    "keys": shapes.keys.tolist(),
                                    "widths": list(zip(shapes.src.tolist(),
                                                       shapes.tgt.tolist(), strict=True))}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def report(rows: list[dict], command: str, commit: str) -> str:
    env = environment()
    lines = ["# Batch shapes an epoch, and their padding", "",
             f"Command: `{command}` ({time.strftime('%Y-%m-%d')}, commit {commit}, "
             f"{env['cpu']}; `benchmarks/batch_shapes.py` says what it counts). Nothing is "
             "timed: the counts are the same on any machine.", "",
             "| length mix | pairs | mean lengths (src, tgt) | tokens a batch | shapes asked "
             "| batches | shapes | padding, both sides | padding, target | padded tokens a "
             "batch |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        for asked, c in [("exact", r["exact"]), *r["shaped"].items()]:
            lines.append(f"| {r['mix']} | {r['pairs']:,} | {r['mean_lengths'][0]}, "
                         f"{r['mean_lengths'][1]} | {r['batch_tokens']:,} | {asked} "
                         f"| {c['batches']:,} | {c['shapes']} | {c['padding_share']:.1%} "
                         f"| {c['tgt_padding_share']:.1%} | {c['tokens_per_batch']:,} |")
    lines += ["", "The 16 shapes' widths (source x target): "
              + "; ".join(f"{r['mix']}: " + ", ".join(f"{a}x{b}" for a, b in r["shaped"][16]
                                                      ["widths"])
                          for r in rows if 16 in r["shaped"]), ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[8, 16, 24, 32])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "batch-shapes.md")
    args = parser.parse_args()
    rows = measure(args.counts)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                            capture_output=True).stdout.strip()
    command = " ".join(["python", "benchmarks/batch_shapes.py", *sys.argv[1:]])
    args.out.write_text(report(rows, command, commit))
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
