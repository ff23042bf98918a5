"""Cached (incremental) against uncached decoding, and MarianMT generate: speed and outputs.

    python benchmarks/decoding.py [--sentences 200] [--length 25] [--threads 2]

Decodes `--sentences` random sources of `--length` tokens with a small untrained model (d_model 256,
3+3 layers), greedy and beam 4, with the key/value cache, recomputing the prefix at every step, and
with MarianMT ``generate`` (our weights copied in; skipped without ``transformers``). Contenders are
interleaved and repeated (``reproduce.speed.decoding_peers.bench_decoding``); medians are
reported. Exits non-zero if cached and uncached outputs differ. ``python -m reproduce bench``
runs the same comparison at the `cpu` and paper sizes, beside training.
"""

from __future__ import annotations

import argparse
import platform
import sys

import torch

from reproduce.config import ModelConfig
from reproduce.paper.model import Transformer
from reproduce.speed.decoding_peers import bench_decoding


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--length", type=int, default=25)
    parser.add_argument("--batch", type=int, default=50, help="sentences per decoding batch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=8000, N=3, d_model=256, d_ff=1024, h=4, d_k=64, d_v=64)
    model = Transformer(config).eval()
    src = torch.randint(4, config.vocab_size, (args.sentences, args.length))
    print(f"# decoding benchmark: {args.sentences} sentences x {args.length} tokens, "
          f"batch {args.batch}, model {config}, torch {torch.__version__}, "
          f"{args.threads} threads, {platform.processor() or platform.machine()}")
    results, checks = bench_decoding(model, list(src.split(args.batch)), args.repeats, beam=4,
                                     alpha=0.6, offset=50)
    for r in results:
        print(f"{r.name:36} {r.rate:8.2f} sentences/s")
    for name, value in checks.items():
        print(f"{name}: {value}")
    return 0 if all(v for k, v in checks.items() if "cached == uncached" in k) else 1


if __name__ == "__main__":
    sys.exit(main())
