"""Evaluation: translation with beam search and BLEU (sacreBLEU on detokenized text)."""

from __future__ import annotations

from collections.abc import Iterable

import sacrebleu
import torch

from .config import DecodeConfig
from .decoding import beam_search
from .model import Transformer


@torch.no_grad()
def translate(model: Transformer, tokenizer, batches: Iterable[tuple[list[int], torch.Tensor]],
              count: int, decode: DecodeConfig) -> list[str]:
    """Beam-search every (indices, src) batch; returns detokenized outputs in original order."""
    model.eval()
    device = next(model.parameters()).device
    out: list[str] = [""] * count
    for indices, src in batches:
        hyps = beam_search(model, src.to(device), tokenizer.bos_id, tokenizer.eos_id,
                           beam=decode.beam, alpha=decode.alpha,
                           max_len_offset=decode.max_len_offset)
        for i, text in zip(indices, tokenizer.decode(hyps), strict=True):
            out[i] = text
    return out


def sacre_bleu(hypotheses: list[str], references: list[str]) -> dict:
    """Corpus sacreBLEU on detokenized text, with its signature (the modern standard)."""
    metric = sacrebleu.metrics.BLEU()
    score = metric.corpus_score(hypotheses, [references])
    return {"kind": "sacrebleu", "score": round(score.score, 2),
            "signature": str(metric.get_signature()), "sentences": len(hypotheses)}
