"""Per-sentence evidence: each sentence's sufficient statistics and NLL, kept beside a record, give
back its corpus scores exactly, for the whole split and for any resample of its sentences."""

from __future__ import annotations

import json
import random

import pytest
import sacrebleu
import torch

from reproduce.config import ModelConfig
from reproduce.paper.bleu import tokenized_bleu
from reproduce.paper.model import Transformer
from reproduce.paper.optim import output_loss
from reproduce.paper.sentence_scores import (
    METRICS,
    chrf,
    corpus_score,
    perplexity,
    sentence_stats,
)
from reproduce.records import store
from reproduce.train import evaluate
from reproduce.train.replay import _evidence_lines

REFS = ["Und Gott sprach: Es werde Licht!", "Und es ward Licht.", "Das Haus-Tor war offen",
        "Er ging hinaus in die Stadt.", "Sie kamen nach Jerusalem, und es war Nacht."]
HYPS = ["Und Gott sagte: Es werde Licht!", "Es wurde Licht.", "Das Haus-Tor ist offen",
        "Er ging in die Stadt hinaus.", "Sie kamen nach Jerusalem."]


class Characters:
    """A tokenizer of one piece a character (ids from 4 up), as the data module calls one."""

    pad_id, bos_id, eos_id, vocab_size = 0, 1, 2, 200

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [[4 + ord(ch) % 190 for ch in text] for text in texts]


def test_corpus_scores_of_any_resample_come_back_from_the_sentences_statistics():
    rng = random.Random(0)
    for _ in range(5):
        index = [rng.randrange(len(HYPS)) for _ in HYPS]  # a bootstrap resample, repeats kept
        hyps, refs = [HYPS[i] for i in index], [REFS[i] for i in index]
        expected = {"sacrebleu": sacrebleu.corpus_bleu(hyps, [refs]).score,
                    "tokenized": tokenized_bleu(hyps, refs, "de")["score"],
                    "chrf": sacrebleu.corpus_chrf(hyps, [refs]).score}
        for kind in METRICS:
            stats = sentence_stats(kind, HYPS, REFS, "de")
            assert corpus_score(kind, stats, index) == pytest.approx(expected[kind], abs=0.006)
    assert perplexity([2.0, 4.0], [1, 3], [1, 1]) == pytest.approx(torch.e ** (8 / 6))


def test_each_sentence_s_nll_sums_to_the_split_s_as_validation_computes_it():
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=200, N=1, d_model=16, d_ff=32, h=2, d_k=8, d_v=8)
    model = Transformer(config).eval()
    pairs = list(zip(REFS, HYPS, strict=True))
    nll, tokens = evaluate.sentence_nll(model, Characters(), pairs, batch_tokens=80)
    assert tokens == [len(t) + 1 for _, t in pairs]  # pieces and EOS
    for i in (0, 3):  # one sentence alone: its own NLL, whatever batch it shared
        alone = evaluate.sentence_nll(model, Characters(), [pairs[i]], batch_tokens=10_000)
        assert alone[0][0] == pytest.approx(nll[i], rel=1e-5)
    from reproduce.data.batching import Encoded
    batch = Encoded.encode(Characters(), pairs).batch(range(len(pairs)), 1, 2)
    with torch.no_grad():
        _, total = output_loss(model.features(batch["src"], batch["tgt_in"]), model.embed.weight,
                               batch["tgt_out"], 0.1, 0)
    assert sum(nll) == pytest.approx(float(total), rel=1e-5)


def _record(tmp_path, nll: list[float], tokens: list[int]) -> dict:
    kept = evaluate.evidence(HYPS, REFS, "de", (nll, tokens))
    outputs = {**store.write_outputs(tmp_path, "run", "dev", HYPS, REFS),
               "evidence": store.write_evidence(tmp_path, "run", "dev", kept)}
    scores = {"sacrebleu": evaluate.sacre_bleu(HYPS, REFS),
              "tokenized": tokenized_bleu(HYPS, REFS, "de"), "chrf": chrf(HYPS, REFS)}
    return {"run_id": "run", "config": {"data": {"corpus": "bible-en-de"}},
            "metrics": {"dev_ppl": round(perplexity(nll, tokens), 3)},
            "bleu": {"dev": {**scores, "outputs": outputs}}}


def test_verify_checks_the_evidence_against_the_outputs_and_the_scores(tmp_path):
    nll, tokens = [10.0, 3.0, 8.0, 9.5, 12.0], [30, 17, 22, 28, 43]
    record = _record(tmp_path, nll, tokens)
    lines, ok = _evidence_lines(record, tmp_path)
    assert ok and lines == ["evidence of dev: 5 sentences, statistics of the kept outputs and the "
                            "recorded scores and dev PPL"]

    record["metrics"]["dev_ppl"] *= 1.01  # a PPL the sentences do not give
    lines, ok = _evidence_lines(record, tmp_path)
    assert not ok and "DIFFERENT from the record: NLL" in lines[0]

    record = _record(tmp_path, nll, tokens)
    path = tmp_path / record["bleu"]["dev"]["outputs"]["evidence"]
    kept = store.read_evidence(tmp_path, record, "dev")
    kept["stats"]["chrf"][0][0] += 1  # one n-gram count edited
    store.write_evidence(tmp_path, "run", "dev", kept)
    lines, ok = _evidence_lines(record, tmp_path)
    assert not ok and lines[0].endswith("DIFFERENT from the record: chrf")

    path.write_bytes(b"not gzip")
    lines, ok = _evidence_lines(record, tmp_path)
    assert not ok and "UNREADABLE" in lines[0]

    del record["bleu"]["dev"]["outputs"]["evidence"]  # an older record: said, not failed
    lines, ok = _evidence_lines(record, tmp_path)
    assert ok and "none kept" in lines[0]
    json.dumps(record)  # the record stays plain JSON
