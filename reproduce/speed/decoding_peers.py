"""Decoding side by side: our greedy and beam search with and without the key/value cache (which
must agree) and MarianMT ``generate`` with the same beam, alpha and maximum length."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from typing import Any

import torch

from reproduce.paper.decoding import beam_search, greedy_search
from reproduce.speed.inputs import BOS, EOS, PAD
from reproduce.speed.peers import copy_into_marian, marian, marian_generate, trainable_parameters
from reproduce.speed.timing import Result, interleaved


def bench_decoding(model, sources: list[torch.Tensor], rounds: int, beam: int, alpha: float,
                   offset: int) -> tuple[list[Result], dict[str, Any]]:
    """Sentences per second of each search; cached and uncached outputs must be identical.

    Returns the results and the checks: cached == uncached per search, and the share of sentences
    where MarianMT's output equals ours (greedy; beam at our alpha; beam with alpha 0 on both)."""
    model.eval()
    c = model.config
    mt = None
    with contextlib.suppress(ImportError):
        mt = marian(c, BOS, EOS).eval()
        copy_into_marian(model, mt)

    def ours(search_beam: int, use_cache: bool, a: float = alpha):
        def run() -> list[list[int]]:
            out = []
            for src in sources:
                if search_beam == 1:
                    out += greedy_search(model, src, BOS, EOS, offset, use_cache=use_cache)
                else:
                    out += beam_search(model, src, BOS, EOS, beam=search_beam, alpha=a,
                                       max_len_offset=offset, use_cache=use_cache)
            return out
        return run

    def theirs(search_beam: int, a: float = alpha):
        def run() -> list[list[int]]:
            out = []
            for src in sources:
                out += marian_generate(mt, src, search_beam, a, offset, PAD, BOS, EOS)
            return out
        return run

    searches = {"greedy": 1, f"beam {beam}": beam}
    fns: dict[str, Callable[[], list[list[int]]]] = {}
    for search, k in searches.items():
        fns[f"{search} | ours, cached"] = ours(k, True)
        fns[f"{search} | ours, uncached"] = ours(k, False)
        if mt is not None:
            fns[f"{search} | MarianMT generate"] = theirs(k)
    outputs: dict[str, list[list[int]]] = {}

    def timed(name):
        def run() -> None:
            outputs[name] = fns[name]()
        return run

    times = interleaved({name: timed(name) for name in fns}, rounds, warmup=0 if rounds > 1 else 1)
    n = sum(src.shape[0] for src in sources)
    results = [Result(name, trainable_parameters(mt if "Marian" in name and mt is not None
                                                 else model), times[name], n)
               for name in fns]
    checks: dict[str, Any] = {}
    for search in searches:
        checks[f"{search}: cached == uncached"] = (
            outputs[f"{search} | ours, cached"] == outputs[f"{search} | ours, uncached"])
        if mt is not None:
            same = sum(a == b for a, b in zip(outputs[f"{search} | ours, cached"],
                                              outputs[f"{search} | MarianMT generate"], strict=True))
            checks[f"{search}: MarianMT output equals ours"] = f"{same}/{n}"
    if mt is not None:
        a0, b0 = ours(beam, True, 0.0)(), theirs(beam, 0.0)()
        same = sum(a == b for a, b in zip(a0, b0, strict=True))
        checks[f"beam {beam}, alpha 0 on both: MarianMT output equals ours"] = f"{same}/{n}"
    lengths = [len(o) for o in outputs[f"beam {beam} | ours, cached"]]
    checks["mean output length (beam, ours)"] = round(statistics.mean(lengths), 1)
    return results, checks
