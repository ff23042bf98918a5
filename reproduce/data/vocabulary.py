"""A corpus's shared BPE vocabulary (section 5.1): the sentencepiece model of ``paper.tokenizer``,
named by the corpus's content (``CorpusSource.fingerprint``), so that a corpus whose files change
gets a new vocabulary and an unchanged one is never trained twice."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

from reproduce.data.source import CorpusSource
from reproduce.data.treebank import tree_symbols
from reproduce.paper.tokenizer import Tokenizer, load_tokenizer, model_path, train_tokenizer
from reproduce.paths import cache_dir
from reproduce.util.files import exclusive

logger = logging.getLogger(__name__)


def tokenizer_path(source: CorpusSource, vocab_size: int, cache: str | Path | None = None,
                   kind: str = "bpe") -> Path:
    """Where the vocabulary of ``kind`` (``config.VOCABULARIES``) of ``source`` with
    ``vocab_size`` entries is (or will be) cached."""
    return model_path(source.tokenizer_name(), vocab_size, cache or cache_dir(), kind)


def corpus_tokenizer(source: CorpusSource, vocab_size: int,
                     cache: str | Path | None = None, kind: str = "bpe") -> Tokenizer:
    """The vocabulary of ``source``'s training pairs (both sides), trained once and then loaded:
    BPE pieces, or one token a word (``kind="words"``, ``paper.tokenizer.WordTokenizer``).

    Treebank corpora keep their tree tokens as whole pieces, and a small treebank may not fill
    ``vocab_size`` (the model's real size is ``Tokenizer.vocab_size``)."""
    path = tokenizer_path(source, vocab_size, cache, kind)
    if path.is_file():
        return load_tokenizer(path)
    waiting = f"{source.corpus}: waiting for another process to train {path}"
    with exclusive(path.with_suffix(".lock"), waiting=waiting):  # one trainer among the ranks
        if path.is_file():
            return load_tokenizer(path)
        return _train(source, vocab_size, path, cache, kind)


def _train(source: CorpusSource, vocab_size: int, path: Path, cache: str | Path | None,
           kind: str) -> Tokenizer:
    trees = source.is_treebank
    symbols = tree_symbols(source.pairs("train"), source.linearization) if trees else ()
    count = [0]

    def sentences() -> Iterator[str]:  # streamed: sentencepiece keeps a bounded sample of them
        for batch in source.train_batches():
            count[0] += len(batch)
            for pair in batch:
                yield from pair

    started = time.perf_counter()
    tokenizer = train_tokenizer(source.tokenizer_name(), vocab_size, sentences(),
                                cache or cache_dir(), symbols=symbols, hard_vocab_limit=not trees,
                                kind=kind)
    seconds = time.perf_counter() - started
    if seconds > 2:
        logger.info("%s: trained a %d-entry %s vocabulary on %d sentences in %.0f s (%s)",
                    source.corpus, tokenizer.vocab_size, kind, 2 * count[0], seconds, path)
    return tokenizer
