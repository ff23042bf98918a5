"""Evaluation: translation with beam search and BLEU (sacreBLEU on detokenized text); parse trees
with beam search, repaired over the input words and scored with EVALB (Table 4)."""

from __future__ import annotations

from collections.abc import Iterable

import sacrebleu
import torch

from reproduce.config import DecodeConfig
from reproduce.paper.decoding import TreeConstraint, beam_search
from reproduce.paper.model import Transformer


@torch.no_grad()
def translate(model: Transformer, tokenizer, batches: Iterable[tuple[list[int], torch.Tensor]],
              count: int, decode: DecodeConfig, words: list[int] | None = None,
              copy_words: bool = False) -> list[str]:
    """Beam-search every (indices, src) batch; returns detokenized outputs in original order.
    With ``decode.constrained`` and ``words`` (input words per sentence), outputs are parse trees
    over exactly those words (``decoding.TreeConstraint``); with ``copy_words`` (the ``words``
    linearization) the trees write the input's own pieces."""
    model.eval()
    device = next(model.parameters()).device
    out: list[str] = [""] * count
    tree = (TreeConstraint.for_tokenizer(tokenizer, model.config.vocab_size)
            if decode.constrained and words is not None else None)
    for indices, src in batches:
        constraint = (tree.start(torch.tensor([words[i] for i in indices], device=device),
                                 src.to(device) if copy_words else None)
                      if tree is not None else None)
        hyps = beam_search(model, src.to(device), tokenizer.bos_id, tokenizer.eos_id,
                           beam=decode.beam, alpha=decode.alpha,
                           max_len_offset=decode.max_len_offset, constraint=constraint)
        # A model may be larger than a soft-limited vocabulary (treebank corpora); ids beyond the
        # tokenizer's are never trained targets and decode to nothing.
        hyps = [[i for i in hyp if i < tokenizer.vocab_size] for hyp in hyps]
        for i, text in zip(indices, tokenizer.decode(hyps), strict=True):
            out[i] = text
    return out


def sacre_bleu(hypotheses: list[str], references: list[str]) -> dict:
    """Corpus sacreBLEU on detokenized text, with its signature (the modern standard)."""
    metric = sacrebleu.metrics.BLEU()
    score = metric.corpus_score(hypotheses, [references])
    # verbose: n-gram precisions, brevity penalty and lengths, as sacrebleu's command line prints
    return {"kind": "sacrebleu", "score": round(score.score, 2),
            "signature": str(metric.get_signature()), "sentences": len(hypotheses),
            "verbose": score.format(width=2)}


def parse_scores(model: Transformer, tokenizer, batches: Iterable[tuple[list[int], torch.Tensor]],
                 pairs: list[tuple[str, str]], gold: list, decode: DecodeConfig,
                 linearization: str = "xx") -> dict:
    """Parse each sentence of ``pairs`` (its words, its linearized gold tree) by beam search, repair
    every output into a tree over the gold words with the gold POS tags (``delinearize``) and score
    the trees against ``gold`` as EVALB with COLLINS.prm does: labelled bracket P, R, F1 (%)."""
    from reproduce.paper.parsing import delinearize, evalb, tag_pos, well_formed, words

    outputs = translate(model, tokenizer, batches, len(pairs), decode,
                        words=[len(source.split()) for source, _ in pairs],
                        copy_words=linearization == "words")
    trees, whole = [], 0
    for (source, _), output, tree in zip(pairs, outputs, gold, strict=True):
        sentence = words(tree)
        if source.split() != sentence:
            raise ValueError(f"gold tree and sentence differ: {source!r}")
        whole += well_formed(output.split(), len(sentence), linearization)
        trees.append(delinearize(output.split(), sentence, tag_pos(tree), linearization))
    score = evalb(list(gold), trees)
    return {"kind": "evalb-collins", **{k: round(score[k], 2) for k in ("precision", "recall", "f1")},
            **{k: score[k] for k in ("matched", "gold_brackets", "test_brackets", "sentences")},
            "well_formed": whole,
            "examples": [{"source": s, "reference": t, "output": o, "tree": tree.pformat(margin=10**6)}
                         for (s, t), o, tree in list(zip(pairs, outputs, trees, strict=True))[:3]]}
