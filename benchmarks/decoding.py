"""Cached (incremental) against uncached decoding: speed and identical outputs.

    python benchmarks/decoding.py [--sentences 200] [--length 25] [--threads 2]

Decodes `--sentences` random sources of `--length` tokens with a small model (d_model 256, 3+3
layers), greedy and beam 4, with the key/value cache and recomputing the prefix at every step.
Contenders are interleaved and repeated; medians are reported. Exits non-zero if the outputs differ.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import torch

from reproduce.config import ModelConfig
from reproduce.decoding import beam_search, greedy_search
from reproduce.model import Transformer

BOS, EOS = 2, 3


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

    def run(search, use_cache):
        out = []
        for i in range(0, args.sentences, args.batch):
            out += search(model, src[i:i + args.batch], use_cache=use_cache)
        return out

    searches = {
        "greedy": lambda m, s, use_cache: greedy_search(m, s, BOS, EOS, 50, use_cache=use_cache),
        "beam4": lambda m, s, use_cache: beam_search(m, s, BOS, EOS, beam=4, alpha=0.6,
                                                     max_len_offset=50, use_cache=use_cache),
    }
    print(f"# decoding benchmark: {args.sentences} sentences x {args.length} tokens, "
          f"batch {args.batch}, model {config}, torch {torch.__version__}, "
          f"{args.threads} threads, {platform.processor() or platform.machine()}")
    ok = True
    for name, search in searches.items():
        times = {True: [], False: []}
        outputs = {}
        for _ in range(args.repeats):
            for use_cache in (True, False):  # interleaved: both see the same machine noise
                start = time.perf_counter()
                outputs[use_cache] = run(search, use_cache)
                times[use_cache].append(time.perf_counter() - start)
        cached, uncached = statistics.median(times[True]), statistics.median(times[False])
        same = outputs[True] == outputs[False]
        ok &= same
        print(f"{name:7} cached {args.sentences / cached:7.1f} sent/s  uncached "
              f"{args.sentences / uncached:7.1f} sent/s  speed-up {uncached / cached:5.2f}x  "
              f"identical outputs: {same}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
