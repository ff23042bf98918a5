"""Sentence noise: how far a change from base would move on another sample of sentences.

A dev set is a sample: 617 verses at `cpu`, 3,000 sentences of newstest2013 in the paper. From each
run's per-sentence evidence (``paper.sentence_scores``, kept beside its record) the sentences are
resampled with replacement ``RESAMPLES`` times, the same resamples for every run of both arms of a
comparison (as sacreBLEU's paired bootstrap resamples both systems alike), each run's metric is
recomputed on each resample, and the variance over resamples of (mean over the variant's seeds -
mean over base's seeds) is the sentence term of a change's noise (``noise.change_noise``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from reproduce.paper.sentence_scores import resampled_perplexity, resampled_scores
from reproduce.paths import results_dir
from reproduce.records.metrics import Metric
from reproduce.records.schema import Record
from reproduce.records.store import read_evidence

RESAMPLES = 1000
SEED = 12345  # sacreBLEU's default (SACREBLEU_SEED)


@lru_cache(maxsize=8)
def resamples(sentences: int, count: int = RESAMPLES) -> np.ndarray:
    """(count, sentences) indices: each row a resample of the sentences with replacement, the
    same for every run scored on a split of that size."""
    return np.random.default_rng(SEED).choice(sentences, size=(count, sentences), replace=True)


# (folder, run, when it finished, its evidence file, metric) -> its resampled scores
_SCORED: dict[tuple[str, str, str, str, str], np.ndarray | None] = {}


def resampled(record: Record, metric: Metric) -> np.ndarray | None:
    """``metric`` of one run on each resample of its split's sentences; None where the record
    keeps no evidence of that split, or the metric is not a corpus score of sentences."""
    folder = results_dir() / record.get("table", "")
    kept_at = record.get("bleu", {}).get(metric.split, {}).get("outputs", {}).get("evidence", "")
    key = (str(folder), record["run_id"], record.get("finished_at", ""), kept_at, metric.key)
    if key not in _SCORED:
        kept = read_evidence(folder, record, metric.split) if metric.sentences else None
        if kept is None or (metric.sentences != "ppl" and metric.sentences not in kept["stats"]):
            _SCORED[key] = None
        else:
            index = resamples(int(kept["sentences"]))
            _SCORED[key] = (resampled_perplexity(kept["nll"], kept["tokens"], index)
                            if metric.sentences == "ppl"
                            else resampled_scores(str(metric.sentences), kept["stats"][metric.sentences],
                                                  index))
    return _SCORED[key]


def sentence_variance(variant: list[Record], base: list[Record], metric: Metric) -> float | None:
    """The variance over resamples of the variant's seed mean minus base's, of ``metric``; None
    unless every run of both arms keeps evidence of the same number of sentences."""
    arms = [[resampled(r, metric) for r in runs] for runs in (variant, base)]
    if not all(arms) or any(s is None for arm in arms for s in arm):
        return None
    if len({s.shape for arm in arms for s in arm if s is not None}) != 1:
        return None  # other dev sets: no common resample
    means = [np.mean(np.stack([s for s in arm if s is not None]), axis=0) for arm in arms]
    return float(np.var(means[0] - means[1], ddof=1))
