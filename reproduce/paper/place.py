"""Where a parser loses its place in the sentence (Table 4's diagnosis).

A linearized tree stands for each word by one slot (its POS tag with ``tags`` targets), and
``parsing.delinearize`` gives the i-th slot the i-th word. A slot the decoder inserts, or one it
drops, shifts every later word under the wrong brackets even where the brackets themselves are
right; a tag it gets wrong in place (a substitution) costs nothing, since EVALB does not score
tags. ``place`` aligns an output's slots with the gold sentence's (Levenshtein, unit costs, on
the tags; with ``xx`` or ``words`` targets on their number alone) and counts matches,
substitutions, insertions and deletions; ``realigned`` rebuilds the tree with each slot given
the word it is aligned to. The F1 of those trees (the *oracle*) less the F1 of the trees as
written is what keeping its place cost; with constrained decoding the slots are as many as the
words, so a shift is one insertion and one deletion.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from nltk.tree import Tree

from reproduce.paper.parsing import POS_TOKEN, delinearize, slot_test, tag_pos, words

Alignment = list[tuple[int | None, int | None]]  # (output slot, gold word): None on one side


def align(output: Sequence[str], gold: Sequence[str]) -> Alignment:
    """A least-cost alignment of ``output``'s slots with ``gold``'s (unit costs), in order. On a
    tie an insertion and a deletion win over two substitutions: a shift, as decoding that has
    lost its place makes it, and the later in the sentence the better (constrained decoding
    makes up a dropped slot by the end)."""
    n, m = len(output), len(gold)
    cost = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        cost[i][0] = i
    for j in range(m + 1):
        cost[0][j] = j
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            cost[i][j] = min(cost[i - 1][j - 1] + (output[i - 1] != gold[j - 1]),
                             cost[i - 1][j] + 1, cost[i][j - 1] + 1)
    pairs: Alignment = []
    i, j = n, m
    while i or j:  # from the end: a shift's extra or missing slot as late as the costs allow
        if i and cost[i][j] == cost[i - 1][j] + 1:
            i -= 1
            pairs.append((i, None))
        elif j and cost[i][j] == cost[i][j - 1] + 1:
            j -= 1
            pairs.append((None, j))
        else:
            i, j = i - 1, j - 1
            pairs.append((i, j))
    return pairs[::-1]


def slots_of(tokens: Sequence[str], linearization: str) -> list[int]:
    """Where ``tokens`` (a model's output) has its word slots."""
    is_slot = slot_test(linearization)
    return [k for k, token in enumerate(tokens) if is_slot(token)]


def gold_slots(tree: Tree, linearization: str) -> list[str]:
    """What the gold linearization writes in each slot, as ``written`` compares it: the tags;
    with ``xx`` or ``words`` targets any slot (a word is written as the vocabulary has it, its
    shape or pieces: only how many slots there are can say a place was lost)."""
    return tag_pos(tree) if linearization == "tags" else [POS_TOKEN] * len(words(tree))


def written(tokens: Sequence[str], slots: Sequence[int], linearization: str) -> list[str]:
    """An output's slots as ``gold_slots`` writes them."""
    return [tokens[k] if linearization == "tags" else POS_TOKEN for k in slots]


def realigned(tokens: Sequence[str], tree: Tree, linearization: str) -> Tree:
    """The tree ``tokens`` describes with each slot given the gold word it is aligned to: an
    inserted slot is dropped, a dropped word gets a slot right after the word before it (before
    the first kept slot if it has none); scored like ``delinearize``'s, with the gold tags."""
    slots = slots_of(tokens, linearization)
    pairs = align(written(tokens, slots, linearization), gold_slots(tree, linearization))
    drop: set[int] = set()
    before: Counter[int] = Counter()
    after: Counter[int] = Counter()
    last, pending = None, 0
    for p, g in pairs:
        if p is None:  # a word with no slot
            if last is None:
                pending += 1
            else:
                after[last] += 1
        elif g is None:  # a slot with no word
            drop.add(slots[p])
        else:
            before[slots[p]] += pending
            last, pending = slots[p], 0
    fixed: list[str] = []
    for k, token in enumerate(tokens):
        if k in drop:
            continue
        fixed += [POS_TOKEN] * before[k] + [token] + [POS_TOKEN] * after[k]
    return delinearize(fixed, words(tree), tag_pos(tree), linearization)


def place(outputs: Sequence[str], gold: Sequence[Tree], linearization: str) -> dict[str, int]:
    """Counts over a split's outputs (each a linearized tree as text) against the gold trees:
    ``words`` (gold), ``slots`` (written), ``matched``, ``substituted``, ``inserted``,
    ``deleted``, ``shifted_sentences`` (with an insertion or deletion) and ``in_place`` (slots
    equal to the gold's at the same position, as ``delinearize`` reads them)."""
    counts = Counter({k: 0 for k in ("words", "slots", "matched", "substituted", "inserted",
                                     "deleted", "shifted_sentences", "in_place")})
    for output, tree in zip(outputs, gold, strict=True):
        tokens = output.split()
        wrote = written(tokens, slots_of(tokens, linearization), linearization)
        want = gold_slots(tree, linearization)
        ops = Counter("inserted" if g is None else "deleted" if p is None else
                      "matched" if wrote[p] == want[g] else "substituted"
                      for p, g in align(wrote, want))
        counts.update(ops)
        counts.update(words=len(want), slots=len(wrote),
                      shifted_sentences=int(bool(ops["inserted"] or ops["deleted"])),
                      in_place=sum(a == b for a, b in zip(wrote, want, strict=False)))
    return dict(counts)
