"""Table 4's corpora: sentence -> linearized parse tree pairs from the Penn Treebank WSJ or NLTK's
sample (read by ``reproduce.paper.parsing``), and the tree symbols the tokenizer keeps whole."""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache

from reproduce.data.corpora import check_split, missing_input, report_pairs
from reproduce.errors import DataError, ParsingDataError
from reproduce.paper.parsing import is_bracket, linearize, load_treebank, read_trees, words


@lru_cache(maxsize=8)
def treebank_trees(split: str, data_dir: str | None = None) -> tuple:
    """Gold trees of a treebank split (cached: dev and test are read again to score)."""
    check_split(split)
    try:
        trees = load_treebank(split, data_dir)
    except ParsingDataError as exc:
        raise DataError(str(exc)) from None
    if not trees:
        where = data_dir or f"NLTK's WSJ sample under NLTK_DATA={os.environ.get('NLTK_DATA', '(unset)')}"
        raise DataError(f"treebank {where}: no trees with words in the {split} split")
    return tuple(trees)


def treebank_pairs(corpus: str, split: str, data_dir: str | None,
                    extra_trees: str | None, linearization: str) -> list[tuple[str, str]]:
    why = missing_input(corpus, extra_trees)
    if why:
        raise DataError(why)
    trees = list(treebank_trees(split, data_dir))
    pairs = [(" ".join(words(tree)), " ".join(linearize(tree, linearization))) for tree in trees]
    if split == "train" and extra_trees:
        try:
            pairs += [(" ".join(words(t)), " ".join(linearize(t, linearization)))
                      for t in read_trees(extra_trees)]
        except ParsingDataError as exc:
            raise DataError(str(exc)) from None
    report_pairs(corpus, split, len(pairs), 0)
    return pairs


def tree_symbols(pairs: Sequence[tuple[str, str]], linearization: str = "xx") -> list[str]:
    """The tokens of linearized trees, each as one sentencepiece piece with its word boundary:
    ``▁(NP``, ``▁)NP``, ``▁XX``. Whole symbols keep an output tree one piece per token. With
    ``linearization="words"`` only the brackets: words are split into pieces as in the source."""
    tokens = {token for _, tree in pairs for token in tree.split()}
    if linearization == "words":
        tokens = {token for token in tokens if is_bracket(token)}
    return sorted("\u2581" + token for token in tokens)
