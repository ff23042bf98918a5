"""Reference points for a run's dev perplexity: unigram and interpolated bigram count models of the
training targets, scored on the same dev pieces."""

from __future__ import annotations

import numpy as np

from reproduce.data.batching import Packed


def ngram_perplexities(train: Packed, dev: Packed, vocab_size: int, bos: int, eos: int,
                       weight: float = 0.7, chunk: int = 1 << 18) -> dict[str, float]:
    """Reference points for a model's dev perplexity: count models of the training targets scored
    per word-piece on the dev targets, EOS included (as ``TranslationModule`` counts).

    ``unigram``: add-1/2 smoothed piece frequencies. ``bigram``: ``weight`` x the bigram relative
    frequency + (1 - weight) x the unigram (the unigram alone after an unseen context). A
    translation model near these has learned target-side statistics, not yet to translate.

    The training targets are counted ``chunk`` sentences at a time, and only the bigrams dev holds
    are counted, so memory stays small at WMT's size (4.5M pairs)."""
    dev_ctx, dev_nxt = _events(dev, 0, len(dev), bos, eos)
    dev_keys = dev_ctx * vocab_size + dev_nxt
    wanted = np.unique(dev_keys)
    counts = np.zeros(vocab_size, dtype=np.float64)
    context_counts = np.zeros(vocab_size, dtype=np.float64)
    pair_counts = np.zeros(len(wanted), dtype=np.int64)
    for begin in range(0, len(train), chunk):
        ctx, nxt = _events(train, begin, min(begin + chunk, len(train)), bos, eos)
        counts += np.bincount(nxt, minlength=vocab_size)
        context_counts += np.bincount(ctx, minlength=vocab_size)
        keys = ctx * vocab_size + nxt
        at = np.minimum(np.searchsorted(wanted, keys), max(len(wanted) - 1, 0))
        hit = wanted[at] == keys if len(wanted) else np.zeros(len(keys), dtype=bool)
        pair_counts += np.bincount(at[hit], minlength=len(wanted))
    unigram = (counts + 0.5) / (counts.sum() + 0.5 * vocab_size)
    pair = pair_counts[np.searchsorted(wanted, dev_keys)]
    seen = context_counts[dev_ctx]
    bigram = np.where(seen > 0, pair / np.maximum(seen, 1), 0.0)
    lam = np.where(seen > 0, weight, 0.0)
    p_uni = unigram[dev_nxt]
    return {"unigram": round(float(np.exp(-np.log(p_uni).mean())), 2),
            "bigram": round(float(np.exp(-np.log(lam * bigram + (1 - lam) * p_uni).mean())), 2)}


def _events(packed: Packed, begin: int, end: int, bos: int, eos: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """(context, predicted piece) of every target position of sentences ``begin:end``: each
    sentence's pieces then EOS, after BOS then the same pieces."""
    lengths = np.asarray(packed.lengths[begin:end], dtype=np.int64)
    ends = np.cumsum(lengths + 1)  # one past each sentence's EOS
    first = ends - lengths - 1
    pieces = packed.pieces(slice(begin, end))
    predicted = np.full(int(ends[-1]) if len(ends) else 0, eos, dtype=np.int64)
    inside = np.ones(len(predicted), dtype=bool)
    inside[ends - 1] = False
    predicted[inside] = pieces
    context = np.roll(predicted, 1)
    context[first] = bos
    return context, predicted
