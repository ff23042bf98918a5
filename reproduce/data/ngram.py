"""Reference points for a run's dev perplexity: unigram and interpolated bigram count models of the
training targets, scored on the same dev pieces."""

from __future__ import annotations

import numpy as np

from reproduce.data.batching import Packed


def ngram_perplexities(train: Packed, dev: Packed, vocab_size: int, bos: int, eos: int,
                       weight: float = 0.7) -> dict[str, float]:
    """Reference points for a model's dev perplexity: count models of the training targets scored
    per word-piece on the dev targets, EOS included (as ``TranslationModule`` counts).

    ``unigram``: add-1/2 smoothed piece frequencies. ``bigram``: ``weight`` x the bigram relative
    frequency + (1 - weight) x the unigram (the unigram alone after an unseen context). A
    translation model near these has learned target-side statistics, not yet to translate."""
    def events(packed: Packed) -> tuple[np.ndarray, np.ndarray]:
        lengths = packed.lengths.numpy()
        ends = np.cumsum(lengths + 1)  # one past each sentence's EOS
        starts = ends - lengths - 1
        offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        pieces = packed.tokens.numpy()[np.repeat(packed.starts.numpy(), lengths) + offsets]
        predicted = np.full(int(ends[-1]) if len(ends) else 0, eos, dtype=np.int64)
        inside = np.ones(len(predicted), dtype=bool)
        inside[ends - 1] = False
        predicted[inside] = pieces
        context = np.roll(predicted, 1)
        context[starts] = bos
        return context, predicted

    (ctx, nxt), (dev_ctx, dev_nxt) = events(train), events(dev)
    counts = np.bincount(nxt, minlength=vocab_size).astype(np.float64)
    unigram = (counts + 0.5) / (counts.sum() + 0.5 * vocab_size)
    keys, key_counts = np.unique(ctx * vocab_size + nxt, return_counts=True)
    context_counts = np.bincount(ctx, minlength=vocab_size).astype(np.float64)
    dev_keys = dev_ctx * vocab_size + dev_nxt
    at = np.minimum(np.searchsorted(keys, dev_keys), len(keys) - 1)
    pair = np.where(keys[at] == dev_keys, key_counts[at], 0)
    seen = context_counts[dev_ctx]
    bigram = np.where(seen > 0, pair / np.maximum(seen, 1), 0.0)
    lam = np.where(seen > 0, weight, 0.0)
    p_uni = unigram[dev_nxt]
    return {"unigram": round(float(np.exp(-np.log(p_uni).mean())), 2),
            "bigram": round(float(np.exp(-np.log(lam * bigram + (1 - lam) * p_uni).mean())), 2)}
