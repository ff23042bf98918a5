"""Where a parser loses its place (``paper.place``): slots aligned with the sentence, a shift told
from a wrong tag, and the oracle tree that gives every slot the word it is aligned to."""

import pytest
from nltk.tree import Tree

from reproduce.paper.evalb import evalb
from reproduce.paper.parsing import delinearize, linearize, tag_pos, words
from reproduce.paper.place import align, place, realigned

GOLD = Tree.fromstring(
    "(S (NP (DT The) (JJ big) (JJ old) (NN dog)) (VP (VBD saw) (NP (DT the) (JJ small) (NN cat))"
    " (PP (IN in) (NP (DT the) (NN garden)))) (. .))")
# One JJ dropped in the subject; the slot made up at the end, after the PP: every word from "old"
# on sits one slot early, under the wrong brackets, though the brackets are the gold's.
SHIFTED = ("(S (NP DT JJ NN )NP (VP VBD (NP DT JJ NN )NP (PP IN (NP DT NN )NP )PP )VP NN . )S")


def test_a_shift_is_one_insertion_and_one_deletion_and_the_oracle_puts_it_right():
    counts = place([SHIFTED], [GOLD], "tags")
    assert (counts["inserted"], counts["deleted"], counts["substituted"]) == (1, 1, 0)
    assert counts["shifted_sentences"] == 1 and counts["words"] == counts["slots"] == 12
    assert counts["in_place"] == 4  # DT JJ before the drop, and the last two by chance: NN .
    written = delinearize(SHIFTED.split(), words(GOLD), tag_pos(GOLD), "tags")
    oracle = realigned(SHIFTED.split(), GOLD, "tags")
    assert evalb([GOLD], [written])["f1"] < 20 and evalb([GOLD], [oracle])["f1"] == 100


def test_a_wrong_tag_in_place_is_a_substitution_and_costs_no_f1():
    output = " ".join(linearize(GOLD, "tags")).replace("JJ JJ", "JJ NN", 1)
    counts = place([output], [GOLD], "tags")
    assert (counts["substituted"], counts["inserted"], counts["deleted"]) == (1, 0, 0)
    assert counts["shifted_sentences"] == 0 and counts["matched"] == 11
    tree = delinearize(output.split(), words(GOLD), tag_pos(GOLD), "tags")
    oracle = realigned(output.split(), GOLD, "tags")
    assert evalb([GOLD], [tree])["f1"] == evalb([GOLD], [oracle])["f1"] == 100


@pytest.mark.parametrize("linearization", ["tags", "xx", "words"])
def test_the_gold_linearization_is_all_in_place(linearization):
    output = " ".join(linearize(GOLD, linearization))
    counts = place([output], [GOLD], linearization)
    assert counts["matched"] == counts["in_place"] == counts["words"] == 12
    assert realigned(output.split(), GOLD, linearization) == delinearize(
        output.split(), words(GOLD), tag_pos(GOLD), linearization)


def test_slots_missing_at_the_start_and_extra_at_the_end_align_in_order():
    assert align(["B", "C", "D", "E"], ["A", "B", "C", "D"]) == [
        (None, 0), (0, 1), (1, 2), (2, 3), (3, None)]
    assert align([], ["A"]) == [(None, 0)] and align(["A"], []) == [(0, None)]
    # words dropped before any kept slot go before the first one, within the tree
    tree = realigned("(S (NP NN )NP (VP VBD )VP . )S".split(), Tree.fromstring(
        "(S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .))"), "tags")
    assert words(tree) == ["The", "dog", "barked", "."] and tree.label() == "S"


def test_with_word_targets_a_word_written_as_its_shape_is_in_its_place():
    """The model writes the vocabulary's form of a word (``<unk-Cap>``, pieces): only the number
    of word slots can say a place was lost."""
    output = " ".join(linearize(GOLD, "words")).replace("The", "<unk-Cap>", 1)
    counts = place([output], [GOLD], "words")
    assert counts["matched"] == counts["in_place"] == 12 and counts["substituted"] == 0
    dropped = output.replace(" old", "", 1)
    assert place([dropped], [GOLD], "words")["deleted"] == 1
