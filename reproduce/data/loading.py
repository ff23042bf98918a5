"""``load_pairs``: the sentence pairs of any corpus's split, whichever loader reads it."""

from __future__ import annotations

from reproduce.data.bible import load_bible_verses
from reproduce.data.corpora import check_split, corpus_spec, nonempty_pairs, report_pairs
from reproduce.data.hub import translation_columns, translation_dataset
from reproduce.data.treebank import treebank_pairs
from reproduce.errors import DataError


def load_pairs(corpus: str, split: str, data_dir: str | None = None,
               extra_trees: str | None = None, linearization: str = "xx") -> list[tuple[str, str]]:
    """(source, target) sentence pairs of ``split`` ("train", "dev" or "test") of ``corpus``.

    With ``data_dir`` the corpus is read from ``<data_dir>/{train,validation,test}.jsonl`` whose
    rows look like ``{"translation": {"en": ..., "de": ...}}``. Pairs with an empty side are
    dropped. Treebank corpora give (words, linearized tree) pairs, one per tree, in treebank
    order (``treebank_trees``); ``extra_trees`` are added to their training split; trees are
    written with their POS tags (``linearization="tags"``) or with ``XX`` (``"xx"``).
    """
    spec = corpus_spec(corpus)
    check_split(split)
    if spec.treebank:
        return treebank_pairs(corpus, split, data_dir, extra_trees, linearization)
    if spec.bible is not None and data_dir is None:
        return [(verse.source, verse.target) for verse in load_bible_verses(corpus, split)]
    dataset, origin = translation_dataset(corpus, split, data_dir)
    sources, targets = translation_columns(dataset, spec, origin)
    pairs, dropped = nonempty_pairs(sources, targets)
    report_pairs(corpus, split, len(pairs), dropped)
    if not pairs:
        raise DataError(f"{origin}: no {spec.source}-{spec.target} pairs with text on both sides")
    return pairs
