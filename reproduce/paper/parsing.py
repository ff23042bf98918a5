"""English constituency parsing as translation (section 6.3, Table 4).

A sentence is translated into its linearized parse tree, as in Vinyals & Kaiser et al. 2014
("Grammar as a Foreign Language"):

* input: the words, ``words(tree)``;
* output: ``linearize(tree)``, one token per bracket or word slot:

  - ``(LABEL`` opens a constituent and ``)LABEL`` closes it (the label is repeated on the closing
    bracket, as in the paper);
  - one token stands for each word: its part-of-speech tag (``NN``, ``DT``, ...; ``tags``, what
    sweeps/table4.yaml uses), ``XX`` (``xx``: every tag normalized, as Vinyals & Kaiser et al.)
    or the word itself (``words``: not the paper's, see below);
  - labels lose their function tags and indices (``NP-SBJ-1`` -> ``NP``); the unlabelled root of
    PTB files, ``( (S ...))``, is written ``(TOP``.

  ``John has a dog .`` -> ``(S (NP NNP )NP (VP VBZ (NP DT NN )NP )VP . )S`` (``tags``),
  ``(S (NP XX )NP (VP XX (NP XX XX )NP )VP XX )S`` (``xx``) or
  ``(S (NP John )NP (VP has (NP a dog )NP )VP . )S`` (``words``).

Why Table 4 uses tags: they are what the paper trained on. Its code (tensor2tensor's WSJ parsing
data generator, ``words_and_tags_from_wsj_tree``) keeps each word's POS tag in the target and drops
only the tag's closing bracket. And they are what a small treebank needs: measured on NLTK's
sample at ``cpu`` scale (d_model 256, 1 thread), ``xx`` targets still gave one input-independent
tree for most sentences after 800 steps (10 distinct outputs for 40 dev sentences, F1 5), while
``tags`` targets gave input-dependent trees after 300 (59 of 60 distinct). Tagging each word is
a per-word signal that teaches the decoder where it is in the sentence. Scoring is the same for
both: predicted tags are not scored (EVALB does not count preterminals) and the repaired tree
carries the gold tags.

Why ``words`` exists: with tags or XX, nothing the decoder has written says which word comes next;
it must count its own word slots and find that word by position. A small model trained on a
small treebank learns this badly (at ``cpu`` scale on the sample the ``tags`` model had a third of
its tags right). With the words in the target, the word it just wrote is in its input, and the
next one is the source token after it. Each word is written as its word pieces, the same pieces
as in the source; constrained decoding (``decoding.TreeConstraint``) then copies them exactly and
the model only decides where brackets open and close. It is not the paper's target format: a
record says which one it used.

``delinearize`` turns any model output back into a tree over exactly the input words, and ``evalb``
scores trees the way EVALB does with COLLINS.prm, the metric of Table 4.

Trees are read with NLTK's ``BracketParseCorpusReader``: the Penn Treebank WSJ (``wsj_dir``, standard
sections) or, without it, NLTK's free 10% WSJ sample split by file.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterator

import nltk
from nltk.corpus.reader import BracketParseCorpusReader
from nltk.tree import Tree

from reproduce.config import LINEARIZATIONS
from reproduce.errors import ParsingDataError

SPLITS = ("train", "dev", "test")

# Standard WSJ split for parsing (Collins 1997 onwards; the paper tunes on 22, reports on 23).
WSJ_SECTIONS = {"train": tuple(range(2, 22)), "dev": (22,), "test": (23,)}

# NLTK's sample holds wsj_0001.mrg .. wsj_0199.mrg (3,914 sentences). It is split by whole files,
# never by sentence, so that sentences of one article never straddle train and test; the blocks are
# contiguous like the PTB sections and sized about 80/10/10 by sentences.
SAMPLE_FILES = {"train": (1, 141), "dev": (142, 171), "test": (172, 199)}
SAMPLE_SENTENCES = {"train": 3098, "dev": 420, "test": 396}

POS_TOKEN = "XX"
# The Penn Treebank's 45 part-of-speech tags (-NONE- marks empty elements, which are removed).
PTB_TAGS = frozenset({
    "#", "$", "''", ",", "-LRB-", "-RRB-", ".", ":", "CC", "CD", "DT", "EX", "FW", "IN", "JJ", "JJR",
    "JJS", "LS", "MD", "NN", "NNP", "NNPS", "NNS", "PDT", "POS", "PRP", "PRP$", "RB", "RBR", "RBS",
    "RP", "SYM", "TO", "UH", "VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "WDT", "WP", "WP$", "WRB", "``"})
ROOT_LABEL = "TOP"
EMPTY_TAG = "-NONE-"

# COLLINS.prm: DELETE_LABEL (punctuation tags lose their words; these labels lose their brackets)
# and EQ_LABEL ADVP PRT. The unlabelled root "" is deleted too, so a score never depends on whether
# a file wrote its root as TOP, as "" or not at all.
EVALB_DELETE = frozenset({"TOP", EMPTY_TAG, ",", ":", "``", "''", "."})
EVALB_EQUAL = {"PRT": "ADVP"}

_COINDEX = re.compile(r"(?:[-=]\d+)+$")
_FUNCTION_TAG = re.compile(r"[-=]")


# ---------------------------------------------------------------------------------------------
# Treebank input
# ---------------------------------------------------------------------------------------------

def load_treebank(split: str, wsj_dir: str | None = None) -> list[Tree]:
    """Gold trees of one split: empty elements stripped (a tree left with no word is dropped), function
    tags kept.

    With ``wsj_dir`` (the PTB's ``parsed/mrg/wsj``, holding section folders ``00``..``24``):
    train = sections 02-21, dev = 22, test = 23. Without it: NLTK's WSJ sample, split by file as in
    ``SAMPLE_FILES``.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    reader, fileids = _wsj_reader(split, wsj_dir) if wsj_dir else _sample_reader(split)
    stripped = (strip_empty(tree) for tree in reader.parsed_sents(fileids))
    return [tree for tree in stripped if tree is not None]


def _wsj_reader(split: str, wsj_dir: str) -> tuple[BracketParseCorpusReader, list[str]]:
    """A reader over the full PTB WSJ and the file ids of the split's sections."""
    if not os.path.isdir(wsj_dir):
        raise ParsingDataError(
            f"treebank {wsj_dir!r} is not a directory (expected the PTB's parsed/mrg/wsj, with section "
            "folders 02-23); without --treebank the NLTK sample is read from NLTK_DATA")
    wsj_dir = os.path.realpath(wsj_dir)
    # Recent NLTK refuses corpus roots outside its data path; the user named this one explicitly.
    if wsj_dir not in nltk.data.path:
        nltk.data.path.append(wsj_dir)
    sections = "|".join(f"{s:02d}" for s in WSJ_SECTIONS[split])
    reader = BracketParseCorpusReader(wsj_dir, rf"({sections})/wsj_\d{{4}}\.mrg")
    fileids = reader.fileids()
    if not fileids:
        raise ParsingDataError(
            f"no wsj_*.mrg files for sections {sections} under {wsj_dir!r} (expected the PTB's "
            "parsed/mrg/wsj; without --treebank the NLTK sample is read from NLTK_DATA)")
    return reader, fileids


def _sample_reader(split: str) -> tuple[BracketParseCorpusReader, list[str]]:
    """A reader over NLTK's WSJ sample and the file ids of the split."""
    try:
        # The trailing slash lets NLTK look inside corpora/treebank.zip as well as a folder.
        root = nltk.data.find("corpora/treebank/combined/")
    except LookupError:
        raise ParsingDataError(
            f"NLTK's WSJ sample corpora/treebank.zip is not under NLTK_DATA="
            f"{os.environ.get('NLTK_DATA', '(unset)')} nor in {', '.join(map(str, nltk.data.path))}: "
            "run `python -m nltk.downloader treebank` or set NLTK_DATA to a folder holding "
            "corpora/treebank.zip; --treebank takes a full Penn Treebank instead") from None
    first, last = SAMPLE_FILES[split]
    return BracketParseCorpusReader(root, r"wsj_\d{4}\.mrg"), sample_fileids(first, last)


def read_trees(path: str) -> Iterator[Tree]:
    """Bracketed trees from a file, or from every file under a folder, one after another (lazily:
    a semi-supervised corpus holds millions). Empty elements are stripped as in ``load_treebank``."""
    if not os.path.exists(path):
        raise ParsingDataError(f"extra trees {path!r}: no such file or folder (bracketed trees, e.g. "
                               "PTB .mrg files or one tree per line)")
    path = os.path.realpath(path)
    if os.path.isdir(path):
        root, fileids = path, r"(?!\.).*"
    else:
        root, fileids = os.path.dirname(path), re.escape(os.path.basename(path))
    if root not in nltk.data.path:
        nltk.data.path.append(root)
    reader = BracketParseCorpusReader(root, fileids)
    if not reader.fileids():
        raise ParsingDataError(f"extra trees {path!r}: the folder holds no files")
    for tree in reader.parsed_sents():
        stripped = strip_empty(tree)
        if stripped is not None:
            yield stripped


def treebank_description(wsj_dir: str | None = None, extra_trees: str | None = None) -> dict:
    """What a run's trees were, for its record and the rendered table."""
    if wsj_dir:
        info = {"kind": "wsj", "path": os.path.realpath(wsj_dir),
                "about": "Penn Treebank WSJ: train sections 02-21, dev 22, test 23 (as the paper)"}
    else:
        files = ", ".join(f"{split} wsj_{a:04d}-{b:04d} ({SAMPLE_SENTENCES[split]} sentences)"
                          for split, (a, b) in SAMPLE_FILES.items())
        info = {"kind": "nltk-sample", "path": None,
                "about": f"NLTK's 10% WSJ sample (3,914 sentences), split by file: {files}. Not "
                         "WSJ sections 02-21 / 22 / 23: F1 is not comparable with the paper's"}
    if extra_trees:
        info["extra_trees"] = os.path.realpath(extra_trees)
    return info


def sample_fileids(first: int, last: int) -> list[str]:
    """File ids ``wsj_FFFF.mrg`` .. ``wsj_LLLL.mrg`` of NLTK's sample, both ends included."""
    return [f"wsj_{number:04d}.mrg" for number in range(first, last + 1)]


def strip_empty(tree: Tree) -> Tree | None:
    """Copy of ``tree`` without empty elements; None if nothing but empty elements is left.

    Removes ``-NONE-`` preterminals (traces, null complementizers, ...), constituents left without
    words, and the co-indices that pointed at the removed traces (``NP-SBJ-1`` -> ``NP-SBJ``,
    ``NP=2`` -> ``NP``). Function tags stay: scoring strips them.
    """
    if _is_preterminal(tree):
        return None if tree.label() == EMPTY_TAG else tree.copy()
    children = []
    for child in tree:
        kept = child if isinstance(child, str) else strip_empty(child)
        if kept is not None:
            children.append(kept)
    if not children:
        return None
    label = tree.label()
    if not label.startswith("-"):
        label = _COINDEX.sub("", label)
    return Tree(label, children)


def words(tree: Tree) -> list[str]:
    """The sentence (model input): the tree's words, empty elements skipped."""
    return [word for word, tag in tree.pos() if tag != EMPTY_TAG]


def tag_pos(tree: Tree) -> list[str]:
    """The tree's POS tags, one per word of ``words(tree)``; pass to ``delinearize`` to restore them."""
    return [tag for _, tag in tree.pos() if tag != EMPTY_TAG]


def _is_preterminal(tree: Tree) -> bool:
    return len(tree) == 1 and isinstance(tree[0], str)


# ---------------------------------------------------------------------------------------------
# Linearization (Vinyals & Kaiser et al. 2014)
# ---------------------------------------------------------------------------------------------

def phrase_label(label: str) -> str:
    """A constituent label as the model sees it: no function tags or indices, root named TOP."""
    if not label:
        return ROOT_LABEL
    if label.startswith("-"):
        return label
    return _FUNCTION_TAG.split(label, maxsplit=1)[0]


def linearize(tree: Tree, linearization: str = "xx") -> list[str]:
    """Bracket sequence of ``tree``: ``(LABEL`` ... ``)LABEL`` with one token per word, its POS
    tag (``linearization="tags"``), ``XX`` (``"xx"``) or the word itself (``"words"``)."""
    if linearization not in LINEARIZATIONS:
        raise ValueError(f"linearization {linearization!r}: one of {', '.join(LINEARIZATIONS)}")
    stripped = strip_empty(tree)
    tokens: list[str] = []
    if stripped is not None:
        _linearize(stripped, tokens, linearization)
    return tokens


def _linearize(node: Tree | str, tokens: list[str], linearization: str) -> None:
    # A bare word directly under a phrase (not PTB style) is treated as if it had a POS tag.
    if isinstance(node, str) or _is_preterminal(node):
        tag = node if isinstance(node, str) else node.label()
        if linearization == "words":
            tokens.append(node if isinstance(node, str) else node[0])
        else:
            tokens.append(tag if linearization == "tags" and tag in PTB_TAGS else POS_TOKEN)
        return
    label = phrase_label(node.label())
    tokens.append("(" + label)
    for child in node:
        _linearize(child, tokens, linearization)
    tokens.append(")" + label)


def is_word_slot(token: str) -> bool:
    """Whether an output token stands for the next word: ``XX`` or a Penn Treebank POS tag."""
    return token == POS_TOKEN or token in PTB_TAGS


def is_bracket(token: str) -> bool:
    """``(LABEL`` or ``)LABEL``."""
    return len(token) > 1 and token[0] in "()"


def slot_test(linearization: str):
    """The word-slot predicate of a linearization: with ``words`` every token that is not a bracket
    is a word (whatever word the model wrote, it stands for the next input word)."""
    if linearization not in LINEARIZATIONS:
        raise ValueError(f"linearization {linearization!r}: one of {', '.join(LINEARIZATIONS)}")
    return (lambda token: not is_bracket(token)) if linearization == "words" else is_word_slot


def normalize_tree(tree: Tree, keep_tags: bool = False) -> Tree:
    """The tree ``linearize`` encodes: empty elements removed, labels as ``phrase_label``, POS as XX.

    ``delinearize(linearize(t), words(t)) == normalize_tree(t)`` for every tree with a word; with
    ``tags=tag_pos(t)`` it equals ``normalize_tree(t, keep_tags=True)``.
    """
    stripped = strip_empty(tree)
    if stripped is None:
        return Tree(ROOT_LABEL, [])
    normalized = _normalize(stripped, keep_tags)
    # A one-word tree with no phrase above its tag comes back from delinearize under a TOP root.
    return Tree(ROOT_LABEL, [normalized]) if _is_preterminal(normalized) else normalized


def _normalize(node: Tree | str, keep_tags: bool) -> Tree:
    if isinstance(node, str):
        return Tree(POS_TOKEN, [node])
    if _is_preterminal(node):
        return Tree(node.label() if keep_tags else POS_TOKEN, [node[0]])
    return Tree(phrase_label(node.label()), [_normalize(child, keep_tags) for child in node])


def delinearize(tokens: list[str], words: list[str], tags: list[str] | None = None,
                linearization: str = "xx") -> Tree:
    """The tree a (possibly malformed) bracket sequence describes, over exactly ``words`` in order.

    Each word slot (``XX`` or a POS tag, ``is_word_slot``; with ``linearization="words"`` any token
    but a bracket, whatever word it is) takes the next word, as a preterminal
    tagged ``tags[i]`` (or ``XX``: a predicted tag is not kept, EVALB does not score it). Well-formed
    output gives back the tree it came from. Anything else is repaired, token by token:

    * ``(LABEL`` opens a constituent; a closing token (``)``, ``)LABEL``) closes the innermost open
      one whatever its label (the opening label wins); a closing token with nothing open is ignored;
    * a word slot beyond the last word is dropped; any other token (``(``, ``<unk>``, a word) is
      ignored;
    * constituents left without words are dropped; brackets still open at the end are closed;
    * words no word slot claimed are appended, as preterminals, to the root;
    * unless the result is exactly one constituent over all words, it is wrapped in a ``TOP`` root
      (a label EVALB deletes, so the wrapper never costs precision).
    """
    if tags is not None and len(tags) != len(words):
        raise ValueError(f"{len(tags)} tags for {len(words)} words")
    is_slot = slot_test(linearization)
    roots: list[Tree] = []
    open_labels: list[str] = []
    open_children: list[list[Tree]] = [roots]
    position = 0
    for token in tokens:
        if is_slot(token):
            if position < len(words):
                tag = tags[position] if tags is not None else POS_TOKEN
                open_children[-1].append(Tree(tag, [words[position]]))
                position += 1
        elif token.startswith("(") and len(token) > 1:
            open_labels.append(token[1:])
            open_children.append([])
        elif token.startswith(")") and open_labels:
            _close(open_labels, open_children)
    while open_labels:
        _close(open_labels, open_children)
    for index in range(position, len(words)):
        tag = tags[index] if tags is not None else POS_TOKEN
        roots.append(Tree(tag, [words[index]]))
    if len(roots) == 1 and position == len(words) and not _is_preterminal(roots[0]):
        return roots[0]
    return Tree(ROOT_LABEL, roots)


def well_formed(tokens: list[str], n_words: int, linearization: str = "xx") -> bool:
    """Whether model output needs no repair: one root constituent, brackets balanced with matching
    labels, none empty, exactly one word slot (``slot_test``) per word and no other tokens."""
    is_slot = slot_test(linearization)
    open_labels: list[str] = []
    filled: list[bool] = []  # whether each open constituent holds a word yet
    roots = xx = 0
    for token in tokens:
        if is_slot(token) and open_labels:
            xx += 1
            filled[-1] = True
        elif token.startswith("(") and len(token) > 1:
            roots += not open_labels
            open_labels.append(token[1:])
            filled.append(False)
        elif token.startswith(")") and open_labels and open_labels[-1] == token[1:] and filled[-1]:
            open_labels.pop()
            filled.pop()
            if filled:
                filled[-1] = True
        else:
            return False
    return not open_labels and roots == 1 and xx == n_words


def _close(open_labels: list[str], open_children: list[list[Tree]]) -> None:
    """Close the innermost open constituent, keeping it only if it holds a word."""
    label, children = open_labels.pop(), open_children.pop()
    if children:
        open_children[-1].append(Tree(label, children))


# ---------------------------------------------------------------------------------------------
# Scoring: EVALB with COLLINS.prm
# ---------------------------------------------------------------------------------------------

def evalb_label(label: str) -> str:
    """A bracket label as EVALB compares it: cut at the first ``-`` or ``=``, PRT read as ADVP."""
    label = _FUNCTION_TAG.split(label, maxsplit=1)[0]
    return EVALB_EQUAL.get(label, label)


def evalb_brackets(tree: Tree) -> tuple[list[str], Counter[tuple[str, int, int]]]:
    """The words EVALB keeps and the multiset of labelled brackets ``(label, start, end)`` over them.

    Words tagged with a DELETE_LABEL (punctuation, ``-NONE-``) are deleted first, so spans count
    non-punctuation words only. POS tags are not brackets; brackets labelled TOP, ``""`` or another
    DELETE_LABEL, and brackets left without words, are not counted.
    """
    kept: list[str] = []
    brackets: Counter[tuple[str, int, int]] = Counter()
    # Iterative walk: repaired model output can nest deeper than Python's recursion limit.
    stack: list[tuple[Tree | str, int | None]] = [(tree, None)]
    while stack:
        node, start = stack.pop()
        if isinstance(node, str):
            kept.append(node)
        elif _is_preterminal(node):
            if node.label() not in EVALB_DELETE:
                kept.append(node[0])
        elif start is None:
            stack.append((node, len(kept)))
            stack.extend((child, None) for child in reversed(node))
        else:
            label = evalb_label(node.label())
            if len(kept) > start and label and label not in EVALB_DELETE:
                brackets[(label, start, len(kept))] += 1
    return kept, brackets


def evalb(gold: list[Tree], test: list[Tree]) -> dict:
    """Corpus labelled-bracket precision, recall and F1 (percent), as EVALB -p COLLINS.prm.

    Brackets are matched per sentence as multisets (a bracket repeated in a unary chain must be
    matched twice) and the counts summed over the corpus. Words are deleted by each tree's own POS
    tags, as EVALB does: give model trees the gold tags (``delinearize(..., tags=tag_pos(gold))``).
    A sentence whose kept words differ from the gold (EVALB's length or word mismatch) raises
    ValueError naming its index.
    """
    if len(gold) != len(test):
        raise ValueError(f"{len(gold)} gold trees but {len(test)} test trees")
    matched = gold_total = test_total = 0
    for index, (gold_tree, test_tree) in enumerate(zip(gold, test, strict=True)):
        gold_words, gold_brackets = evalb_brackets(gold_tree)
        test_words, test_brackets = evalb_brackets(test_tree)
        if len(gold_words) != len(test_words):
            raise ValueError(
                f"sentence {index}: length mismatch, {len(gold_words)} gold words but {len(test_words)} "
                "test words after deleting punctuation (restore gold POS tags with tag_pos)")
        if gold_words != test_words:
            raise ValueError(f"sentence {index}: words differ from the gold sentence")
        matched += sum((gold_brackets & test_brackets).values())
        gold_total += sum(gold_brackets.values())
        test_total += sum(test_brackets.values())
    precision = 100.0 * matched / test_total if test_total else 0.0
    recall = 100.0 * matched / gold_total if gold_total else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "matched": matched,
            "gold_brackets": gold_total, "test_brackets": test_total, "sentences": len(gold)}


def bracket_f1(gold: list[Tree], test: list[Tree]) -> float:
    """Corpus labelled-bracket F1 (percent) of ``evalb``: the number Table 4 reports."""
    return evalb(gold, test)["f1"]
