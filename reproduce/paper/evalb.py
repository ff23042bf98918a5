"""Table 4's metric: labelled-bracket precision, recall and F1 as EVALB computes them with
COLLINS.prm (the parameter file of the parsing papers the paper compares with)."""

from __future__ import annotations

from collections import Counter

from nltk.tree import Tree

from reproduce.paper.parsing import EMPTY_TAG, FUNCTION_TAG, is_preterminal

# COLLINS.prm: DELETE_LABEL (punctuation tags lose their words; these labels lose their brackets)
# and EQ_LABEL ADVP PRT. The unlabelled root "" is deleted too, so a score never depends on whether
# a file wrote its root as TOP, as "" or not at all.
EVALB_DELETE = frozenset({"TOP", EMPTY_TAG, ",", ":", "``", "''", "."})
EVALB_EQUAL = {"PRT": "ADVP"}




def evalb_label(label: str) -> str:
    """A bracket label as EVALB compares it: cut at the first ``-`` or ``=``, PRT read as ADVP."""
    label = FUNCTION_TAG.split(label, maxsplit=1)[0]
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
        elif is_preterminal(node):
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
