"""The evaluation protocol of a trained model (``task_scores``): translation with beam search and
BLEU both ways (sacreBLEU on detokenized text, and the paper's tokenized BLEU) and chrF, every
output kept beside the record with each sentence's evidence (``paper.sentence_scores``: the
scores' sufficient statistics, the NLL and target tokens); parse trees with beam search,
repaired over the input words and scored with EVALB (Table 4, ``train.parses``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import sacrebleu
import torch

from reproduce.config import Config, DecodeConfig
from reproduce.data import batch_by_tokens, is_treebank, treebank_trees
from reproduce.data.batching import Encoded
from reproduce.data.treebank import treebank_description
from reproduce.paper import parsing, sentence_scores
from reproduce.paper.bleu import tokenized_bleu
from reproduce.paper.decoding import TreeConstraint, beam_search
from reproduce.paper.model import Transformer
from reproduce.records import store as records
from reproduce.train import parses


@torch.no_grad()
def translate(model: Transformer, tokenizer, batches: Iterable[tuple[list[int], torch.Tensor]],
              count: int, decode: DecodeConfig, words: list[int] | None = None,
              copy_words: bool = False, pieces: list[int] | None = None) -> list[str]:
    """Beam-search every (indices, src) batch; returns detokenized outputs in original order
    (``pieces``, where given, gets each output's length in decoded pieces, EOS not counted).
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
                      if tree is not None and words is not None else None)
        hyps = beam_search(model, src.to(device), tokenizer.bos_id, tokenizer.eos_id,
                           beam=decode.beam, alpha=decode.alpha,
                           max_len_offset=decode.max_len_offset, constraint=constraint)
        # A model may be larger than a soft-limited vocabulary (treebank corpora); ids beyond the
        # tokenizer's are never trained targets and decode to nothing.
        hyps = [[i for i in hyp if i < tokenizer.vocab_size] for hyp in hyps]
        for i, text, hyp in zip(indices, tokenizer.decode(hyps), hyps, strict=True):
            out[i] = text
            if pieces is not None:
                pieces[i] = len(hyp)
    return out


def sacre_bleu(hypotheses: list[str], references: list[str]) -> dict:
    """Corpus sacreBLEU on detokenized text, with its signature (the modern standard)."""
    metric = sacrebleu.metrics.BLEU()
    score = metric.corpus_score(hypotheses, [references])
    # verbose: n-gram precisions, brevity penalty and lengths, as sacrebleu's command line prints
    return {"kind": "sacrebleu", "score": round(score.score, 2),
            "signature": str(metric.get_signature()), "sentences": len(hypotheses),
            "verbose": score.format(width=2)}


@torch.no_grad()
def sentence_nll(model: Transformer, tokenizer, pairs: list[tuple[str, str]], batch_tokens: int,
                 precision: str = "32-true") -> tuple[list[float], list[int]]:
    """Each pair's target NLL (nats, summed over its pieces and EOS, teacher-forced, dropout off)
    and its target token count, in the order of ``pairs``: summed and divided, the split's PPL as
    validation computes it (``lit.TranslationModule``), under the run's ``precision``."""
    model.eval()
    device = next(model.parameters()).device
    encoded = Encoded.encode(tokenizer, pairs)
    nll, tokens = [0.0] * len(pairs), [0] * len(pairs)
    pad, weight = model.config.pad_id, model.embed.weight
    half = {"bf16": torch.bfloat16, "16-": torch.float16}
    dtype = next((t for k, t in half.items() if precision.startswith(k)), None)
    for indices in batch_by_tokens(encoded.lengths, batch_tokens, shuffle=False, seed=0):
        batch = {k: v.to(device) for k, v in encoded.batch(indices, tokenizer.bos_id,
                                                           tokenizer.eos_id).items()}
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            hidden = model.features(batch["src"], batch["tgt_in"])
        rows = max(1, (1 << 24) // max(1, hidden.shape[1] * weight.shape[0]))  # ~16M logits
        for start in range(0, hidden.shape[0], rows):
            h, t = hidden[start:start + rows].float(), batch["tgt_out"][start:start + rows]
            logp = torch.log_softmax(h @ weight.float().t(), dim=-1)
            real = t != pad
            per = -(logp.gather(-1, t[..., None])[..., 0] * real).sum(1).double()
            for i, value, n in zip(indices[start:start + rows], per.tolist(),
                                   real.sum(1).tolist(), strict=True):
                nll[i], tokens[i] = value, int(n)
    return nll, tokens


def evidence(hypotheses: list[str], references: list[str], lang: str,
             nll: tuple[list[float], list[int]]) -> dict[str, Any]:
    """A split's per-sentence evidence: each metric's sufficient statistics
    (``paper.sentence_scores``) and the NLL and target tokens of each sentence (``_bleu`` adds
    each output's length in decoded pieces: how far decoding reached into the positions)."""
    return {"sentences": len(hypotheses),
            "stats": {kind: sentence_scores.sentence_stats(kind, hypotheses, references, lang)
                      for kind in sentence_scores.METRICS},
            "nll": [round(x, 5) for x in nll[0]], "tokens": nll[1]}


def decode_batch_tokens(c: Config) -> int:
    """Source tokens per decoding batch. Parsing (treebank corpora): beam x (input +
    max_len_offset) cached positions per sentence, so fewer sentences per batch."""
    if is_treebank(c.data.corpus):
        return max(64, c.train.batch_tokens // c.decode.beam)
    return c.train.batch_tokens


def _bleu(model, tokenizer, data, pairs, c: Config, lang: str, precision: str) -> dict[str, Any]:
    """Both BLEU conventions and chrF, each labelled, a few example outputs, and the split's
    per-sentence evidence."""
    sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
    pieces = [0] * len(sources)
    hyps = translate(model, tokenizer, data.source_batches(sources, decode_batch_tokens(c)),
                     len(sources), c.decode, pieces=pieces)
    nll = sentence_nll(model, tokenizer, pairs, decode_batch_tokens(c), precision)
    return {"sacrebleu": sacre_bleu(hyps, refs), "tokenized": tokenized_bleu(hyps, refs, lang),
            "chrf": sentence_scores.chrf(hyps, refs),
            "examples": [{"source": s, "reference": t, "output": h}
                         for s, t, h in list(zip(sources, refs, hyps, strict=True))[:3]],
            "hypotheses": hyps, "references": refs,
            "evidence": {**evidence(hyps, refs, lang, nll), "decoded_pieces": pieces}}


def task_scores(model, tokenizer, data, c: Config, splits: tuple[str, ...] = ("dev", "test"),
                outputs: tuple[Path, str] | None = None, precision: str = "32-true",
                known: dict[str, dict[str, Any]] | None = None
                ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The task's evaluation: (record entries, headline metrics). Translation: both BLEUs and
    chrF of each split, and with ``outputs`` (the records folder, the run id) every hypothesis and
    each sentence's evidence kept there (``precision``: the run's, for the NLL of each sentence).
    Parsing (treebank corpora, Table 4): EVALB precision, recall and F1 of each split, where the
    parser lost its place, and every output kept (``train.parses``). ``known``: a split's entry
    already made on these weights (``dev_score``, as ``train.pick`` chose them)."""
    pairs = {"dev": data.dev_pairs, "test": data.test_pairs}
    if not is_treebank(c.data.corpus):
        lang = c.data.corpus.rsplit("-", 1)[-1]
        bleu = {name: (known or {}).get(name) or _bleu(model, tokenizer, data, pairs[name], c,
                                                        lang, precision)
                for name in splits}
        for name, b in bleu.items():
            hyps, refs, kept = b.pop("hypotheses"), b.pop("references"), b.pop("evidence")
            if outputs is not None:  # every output kept beside the record (records.write_outputs)
                b["outputs"] = {**records.write_outputs(*outputs, name, hyps, refs),
                                "evidence": records.write_evidence(*outputs, name, kept)}
        return {"bleu": bleu}, {
            **{f"{n}_bleu": bleu[n]["sacrebleu"]["score"] for n in splits},
            **{f"{n}_bleu_tokenized": bleu[n]["tokenized"]["score"] for n in splits},
            **{f"{n}_chrf": bleu[n]["chrf"]["score"] for n in splits}}

    return _parse_task(model, tokenizer, data, c, splits, outputs, known or {})


def dev_metric(c: Config) -> str:
    """The name of the task's dev metric (``dev_score``): ``f1`` or ``bleu``."""
    return "f1" if is_treebank(c.data.corpus) else "bleu"


def dev_score(model, tokenizer, data, c: Config, precision: str = "32-true"
              ) -> tuple[float, dict[str, Any]]:
    """The task's dev metric of ``model`` (parsing: F1; translation: sacreBLEU) and the dev
    entry it came from, which ``task_scores`` takes as known (``train.pick``)."""
    if is_treebank(c.data.corpus):
        entry = _parse_split(model, tokenizer, data, c, "dev", c.decode)
        return entry["f1"], entry
    entry = _bleu(model, tokenizer, data, data.dev_pairs, c, c.data.corpus.rsplit("-", 1)[-1],
                  precision)
    return entry["sacrebleu"]["score"], entry


def _parse_split(model, tokenizer, data, c: Config, name: str, decode: DecodeConfig
                 ) -> dict[str, Any]:
    """Parse split ``name`` by beam search and score it (``parses.score_outputs``); the outputs
    under ``"texts"``."""
    pairs = data.dev_pairs if name == "dev" else data.test_pairs
    gold = treebank_trees(name, c.data.data_dir or None)[:len(pairs)]
    for (source, _), tree in zip(pairs, gold, strict=True):
        if source.split() != parsing.words(tree):
            raise ValueError(f"gold tree and sentence differ: {source!r}")
    outputs = translate(model, tokenizer,
                        data.source_batches([s for s, _ in pairs], decode_batch_tokens(c)),
                        len(pairs), decode, words=[len(source.split()) for source, _ in pairs],
                        copy_words=c.data.linearization == "words")
    return {**parses.score_outputs(outputs, gold, c.data.linearization), "texts": outputs}


def _parse_task(model, tokenizer, data, c: Config, splits: tuple[str, ...],
                outputs: tuple[Path, str] | None, known: dict[str, dict[str, Any]]
                ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Parsing's entries: each split's EVALB scores (and, with ``decode.constrained``, free
    decoding's too: the paper's protocol), every output kept with ``outputs``."""
    evalb = {name: parses.keep(known.get(name) or _parse_split(model, tokenizer, data, c, name,
                                                               c.decode), outputs, name)
             for name in splits}
    headline = {f"{n}_{k}": evalb[n][k] for n in splits for k in ("f1", "precision", "recall")}
    if c.decode.constrained:  # the paper's protocol too: free decoding, repaired
        for name in splits:
            scores = parses.keep(_parse_split(model, tokenizer, data, c, name,
                                              replace(c.decode, constrained=False)),
                                 outputs, name, "free")
            evalb[name]["free"] = {k: scores[k] for k in scores if k != "examples"}
            headline[f"{name}_f1_free"] = scores["f1"]
    return {"evalb": evalb, "treebank": treebank_description(c.data.data_dir or None,
                                                             c.data.extra_trees or None)}, headline
