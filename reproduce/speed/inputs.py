"""What the benchmark measures on: its plans (batches and rounds per scale), random batches, and
Bible EN-DE batches from the cached `cpu`-scale vocabulary."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from reproduce.config import Config, ModelConfig
from reproduce.data import batch_by_tokens, load_pairs
from reproduce.data.module import TranslationData
from reproduce.paper.flops import analytic_flops
from reproduce.paper.tokenizer import train_tokenizer
from reproduce.paths import cache_dir

PAD, BOS, EOS = 0, 2, 3  # the tokenizer's ids (reproduce.paper.tokenizer)


OURS = "ours"
COMPILED = "ours, torch.compile"


BIBLE_VOCAB = 8000  # the `cpu` scale's cached Bible BPE; its ids are valid in any larger vocabulary


@dataclass(frozen=True)
class Plan:
    """How much to measure at one scale."""

    batch_tokens: int | None  # tokens per training batch; None: the scale's own
    batches: int  # training batches per round (the same ones for every contender)
    rounds: int
    sentences: int  # decoded per round; 0: no decoding
    length: int  # source length of synthetic sentences (untrained weights)
    decode_rounds: int


PLANS = {  # (scale, quick) -> plan; the paper's sizes are slow on a CPU: small batches, few repeats
    ("cpu", False): Plan(None, 4, 5, 48, 20, 3),
    ("cpu", True): Plan(None, 2, 3, 8, 10, 2),
    ("paper", False): Plan(1024, 2, 3, 8, 10, 2),
    ("paper", True): Plan(512, 1, 2, 0, 0, 0),
}


OTHER = {False: Plan(None, 3, 3, 8, 8, 2), True: Plan(None, 2, 2, 4, 6, 1)}


def real_tokens(batch: dict[str, torch.Tensor]) -> int:
    return int((batch["tgt_out"] != PAD).sum())


def batch_flops(model_config: ModelConfig, batch: dict[str, torch.Tensor]) -> float:
    """Training FLOPs of one padded batch as computed (``flops.analytic_flops``)."""
    (b, s), t = batch["src"].shape, batch["tgt_in"].shape[1]
    return analytic_flops(model_config, b * s, b * t, b * s * s, b * t * t, b * t * s)


def synthetic_batches(vocab: int, batch_tokens: int, count: int, max_len: int,
                      seed: int) -> list[dict[str, torch.Tensor]]:
    """Token-count batches (``data.batch_by_tokens``) of random ids with sentence-like lengths:
    sources log-normal around 30 pieces, targets about 10% longer (as German is)."""
    rng = np.random.default_rng(seed)
    src = np.clip(np.rint(rng.lognormal(math.log(30), 0.5, 20000)), 1, max_len - 1)
    tgt = np.clip(np.rint(src * rng.lognormal(0.1, 0.2, src.size)), 1, max_len - 1)
    lengths = np.stack([src, tgt], axis=1).astype(np.int64) + 1  # + EOS / BOS
    gen = torch.Generator().manual_seed(seed)
    out = []
    for indices in batch_by_tokens(lengths, batch_tokens, shuffle=True, seed=seed)[:count]:
        (S, T), B = lengths[indices].max(axis=0), len(indices)
        src_t = torch.randint(4, vocab, (B, S), generator=gen)
        tgt_t = torch.randint(4, vocab, (B, T + 1), generator=gen)
        for row, (s, t) in enumerate(lengths[indices]):
            src_t[row, s - 1], src_t[row, s:] = EOS, PAD
            tgt_t[row, t], tgt_t[row, t + 1:] = EOS, PAD  # BOS + t - 1 pieces + EOS
        tgt_t[:, 0] = BOS
        out.append({"src": src_t, "tgt_in": tgt_t[:, :-1], "tgt_out": tgt_t[:, 1:]})
    return out


class Bible:
    """Bible EN-DE, encoded once with the cached BPE of the `cpu` scale (the real length mix)."""

    def __init__(self, vocab: int, max_tokens_per_sentence: int, seed: int):
        pairs = load_pairs("bible-en-de", "train")
        self.tokenizer = train_tokenizer("bible-en-de", vocab, (s for p in pairs for s in p),
                                         cache_dir())
        config = Config().overrides(corpus="bible-en-de", batch_tokens=4096, seed=seed,
                                    max_tokens_per_sentence=max_tokens_per_sentence)
        self.data = TranslationData(config, self.tokenizer)
        self.data.setup()

    def batches(self, batch_tokens: int, count: int) -> tuple[list[dict[str, torch.Tensor]], float]:
        """The first `count` shuffled training batches, and the seconds the data module took per batch."""
        self.data.train_config = replace(self.data.train_config, batch_tokens=batch_tokens)
        loader = iter(self.data.train_dataloader())
        next(loader)  # plans the epoch
        start = time.perf_counter()
        batches = list(itertools.islice(loader, count))
        return batches, (time.perf_counter() - start) / len(batches)

    def sources(self, count: int, batch_tokens: int, seed: int) -> list[torch.Tensor]:
        """`count` dev sentences, drawn at random, batched by length as evaluation batches them."""
        pairs = self.data.dev_pairs
        pick = np.random.default_rng(seed).choice(len(pairs), min(count, len(pairs)), replace=False)
        texts = [pairs[i][0] for i in sorted(pick)]
        return [src for _, src in self.data.source_batches(texts, batch_tokens)]
