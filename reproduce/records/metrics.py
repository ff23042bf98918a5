"""The metrics a record holds, each with its facts in one place: the record's key, its label, the
digits a table shows, which way is better, and the key of the paper's figure beside it in a spec
(``paper:``). Tables, figures, the front page's summary, the dashboard's W&B table and verdicts
read them here (after lm-evaluation-harness's registry of metrics and their aggregations)."""

from __future__ import annotations

from dataclasses import dataclass

from reproduce.records.schema import MetricName


@dataclass(frozen=True)
class Metric:
    key: MetricName  # in the record's ``metrics``
    label: str  # in figures and prose: "dev PPL"
    short: str  # in a table's headings and verdicts: "PPL"
    digits: int  # shown after the point in our cells
    lower_is_better: bool
    paper_key: str | None = None  # the spec's figure for it (``paper: {ppl: 4.92}``), if any
    # How a resample of the split's sentences rescores it from a record's evidence
    # (paper.sentence_scores): "ppl", or the kind of corpus score; None: it cannot be
    sentences: str | None = None
    # The least difference of two of the paper's figures that a within-row pair counts
    # (tables/agreement.py): the paper prints PPL to 0.01 and BLEU to 0.1
    min_paper_gap: float = 0.0
    paper_digits: int | None = None  # how a table prints the paper's figure (None: as written)

    @property
    def split(self) -> str:
        """The split it is measured on (dev, test), from its key."""
        return self.key.split("_", 1)[0]


DEV_PPL = Metric("dev_ppl", "dev PPL", "PPL", 2, True, "ppl", "ppl", 0.1, 2)  # 5.00, not 5.0
DEV_BLEU = Metric("dev_bleu", "dev BLEU", "BLEU", 1, False, "bleu", "sacrebleu", 0.3)
TEST_BLEU = Metric("test_bleu", "test BLEU", "BLEU", 1, False, None, "sacrebleu")
TEST_BLEU_TOKENIZED = Metric("test_bleu_tokenized", "test BLEU (tokenized)", "BLEU", 2, False,
                             "bleu", "tokenized")
DEV_CHRF = Metric("dev_chrf", "dev chrF", "chrF", 1, False, None, "chrf")
TEST_CHRF = Metric("test_chrf", "test chrF", "chrF", 1, False, None, "chrf")
TEST_F1 = Metric("test_f1", "test F1", "F1", 1, False, "f1")
PARAMS = Metric("params", "parameters", "params", 0, False, "params_m")
TRAIN_STEPS = Metric("train_steps", "training steps", "steps", 0, False)
TRAIN_SECONDS = Metric("train_seconds", "training seconds", "seconds", 0, True)

METRICS: dict[str, Metric] = {m.key: m for m in (
    DEV_PPL, DEV_BLEU, TEST_BLEU, TEST_BLEU_TOKENIZED, DEV_CHRF, TEST_CHRF, TEST_F1, PARAMS, TRAIN_STEPS,
    TRAIN_SECONDS)}

# What Table 3 compares with base, in this order: its verdicts, figures and the front page's summary
COMPARED: tuple[Metric, ...] = (DEV_PPL, DEV_BLEU)
