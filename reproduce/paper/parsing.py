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

``delinearize`` turns any model output back into a tree over exactly the input words;
``paper.evalb`` scores trees, and ``data.treebank`` reads them.
"""

from __future__ import annotations

import re

from nltk.tree import Tree

from reproduce.config import LINEARIZATIONS

POS_TOKEN = "XX"
# The Penn Treebank's 45 part-of-speech tags (-NONE- marks empty elements, which are removed).
PTB_TAGS = frozenset({
    "#", "$", "''", ",", "-LRB-", "-RRB-", ".", ":", "CC", "CD", "DT", "EX", "FW", "IN", "JJ", "JJR",
    "JJS", "LS", "MD", "NN", "NNP", "NNPS", "NNS", "PDT", "POS", "PRP", "PRP$", "RB", "RBR", "RBS",
    "RP", "SYM", "TO", "UH", "VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "WDT", "WP", "WP$", "WRB", "``"})
ROOT_LABEL = "TOP"
EMPTY_TAG = "-NONE-"

_COINDEX = re.compile(r"(?:[-=]\d+)+$")
FUNCTION_TAG = re.compile(r"[-=]")  # where a label's function tags begin: NP-SBJ, PP=2


def strip_empty(tree: Tree) -> Tree | None:
    """Copy of ``tree`` without empty elements; None if nothing but empty elements is left.

    Removes ``-NONE-`` preterminals (traces, null complementizers, ...), constituents left without
    words, and the co-indices that pointed at the removed traces (``NP-SBJ-1`` -> ``NP-SBJ``,
    ``NP=2`` -> ``NP``). Function tags stay: scoring strips them.
    """
    if is_preterminal(tree):
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


def is_preterminal(tree: Tree) -> bool:
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
    return FUNCTION_TAG.split(label, maxsplit=1)[0]


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
    if isinstance(node, str) or is_preterminal(node):
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
    return Tree(ROOT_LABEL, [normalized]) if is_preterminal(normalized) else normalized


def _normalize(node: Tree | str, keep_tags: bool) -> Tree:
    if isinstance(node, str):
        return Tree(POS_TOKEN, [node])
    if is_preterminal(node):
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
    if len(roots) == 1 and position == len(words) and not is_preterminal(roots[0]):
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


