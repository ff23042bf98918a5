"""Per-sentence evidence of a corpus score, and the score of any resample of its sentences.

Corpus BLEU and chrF are not means of sentence scores: each is a function of statistics summed
over the corpus (BLEU: hypothesis and reference lengths, matched and total n-grams for n = 1..4;
chrF: matched and total character and word n-grams). Keeping those statistics per sentence, as
sacreBLEU's paired bootstrap does (``sacrebleu.significance``), lets the score of any
subset or resample of the sentences be recomputed exactly, without the texts. Perplexity is the
same: the NLL summed over a resample's target tokens, over their count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from sacrebleu.metrics import BLEU, CHRF

from reproduce.paper.bleu import _multi_bleu_metric, moses_tokenize, split_compounds

Stats = list[list[int]]  # one row of sufficient statistics a sentence

# The metrics a split keeps per sentence: sacreBLEU (detokenized), the paper's tokenized BLEU
# (paper.bleu) and sacreBLEU's chrF, each built as its corpus score is.
METRICS: dict[str, Callable[[], Any]] = {"sacrebleu": BLEU, "tokenized": _multi_bleu_metric, "chrf": CHRF}


def chrf(hypotheses: list[str], references: list[str]) -> dict:
    """Corpus chrF (sacreBLEU's: character 6-grams, beta 2), with its signature."""
    metric = CHRF()
    score = metric.corpus_score(hypotheses, [references])
    return {"kind": "chrf", "score": round(score.score, 2),
            "signature": str(metric.get_signature()), "sentences": len(hypotheses)}


def sentence_stats(kind: str, hypotheses: list[str], references: list[str],
                   lang: str = "") -> Stats:
    """Each sentence's sufficient statistics of metric ``kind`` (``METRICS``); the tokenized
    kind Moses-tokenizes and splits compounds first, as ``paper.bleu.tokenized_bleu`` does."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if kind == "tokenized":
        hypotheses, references = ([split_compounds(line) for line in moses_tokenize(side, lang)]
                                  for side in (hypotheses, references))
    rows = METRICS[kind]()._extract_corpus_statistics(hypotheses, [references])
    return [[int(x) for x in row] for row in rows]


def corpus_score(kind: str, stats: Sequence[Sequence[int]],
                 index: Sequence[int] | None = None) -> float:
    """The corpus score of metric ``kind`` over the sentences at ``index`` (repeats count
    again; None: all), from their statistics: what the metric scores on those sentences."""
    return float(resampled_scores(kind, stats, _one(len(stats), index))[0])


def _one(sentences: int, index: Sequence[int] | None) -> np.ndarray:
    """``index`` (None: every sentence) as the one row of a resample array."""
    return np.asarray(range(sentences) if index is None else index, dtype=np.int64)[None]


def resampled_scores(kind: str, stats: Sequence[Sequence[int]], index: np.ndarray) -> np.ndarray:
    """The corpus score of metric ``kind`` on each resample of sentences, ``index`` (resamples,
    sentences): ``corpus_score`` of every row at once."""
    totals = np.asarray(stats, dtype=np.int64)[index].sum(axis=1)
    metric = METRICS[kind]()
    return np.array([metric._compute_score_from_stats(list(row)).score for row in totals])


def resampled_perplexity(nll: Sequence[float], tokens: Sequence[int],
                         index: np.ndarray) -> np.ndarray:
    """``perplexity`` of each resample of sentences, ``index`` (resamples, sentences)."""
    summed = np.asarray(nll, dtype=np.float64)[index].sum(axis=1)
    counted = np.maximum(np.asarray(tokens, dtype=np.int64)[index].sum(axis=1), 1)
    return np.exp(np.minimum(summed / counted, 50.0))


def perplexity(nll: Sequence[float], tokens: Sequence[int],
               index: Sequence[int] | None = None) -> float:
    """exp(summed NLL / summed target tokens) over the sentences at ``index`` (None: all)."""
    return float(resampled_perplexity(nll, tokens, _one(len(nll), index))[0])
