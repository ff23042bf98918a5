"""Constituency parsing as translation: treebank split, linearization, repair and EVALB scoring.

Pure Python on hand-written trees; one test reads NLTK's WSJ sample when NLTK_DATA provides it.
"""

import random

import nltk
import pytest
from nltk.tree import Tree

from reproduce.data.treebank import (
    SAMPLE_FILES,
    SAMPLE_SENTENCES,
    SPLITS,
    load_treebank,
    read_trees,
    sample_fileids,
)
from reproduce.errors import ParsingDataError
from reproduce.paper.evalb import bracket_f1, evalb, evalb_brackets
from reproduce.paper.parsing import (
    PTB_TAGS,
    delinearize,
    linearize,
    normalize_tree,
    strip_empty,
    tag_pos,
    well_formed,
    words,
)
from tests.helpers import treebank_sample_present

T = Tree.fromstring

# PTB-style trees: function tags and indices, traces, unary chains, punctuation, an unlabelled root.
PTB_TREES = [
    "(S (NP-SBJ-1 (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog))) (. .))",
    "(S (NP-SBJ (NP (NNP Pierre) (NNP Vinken)) (, ,) (ADJP (NP (CD 61) (NNS years)) (JJ old)) (, ,))"
    " (VP (MD will) (VP (VB join) (NP (DT the) (NN board)) (PP-CLR (IN as) (NP (DT a) (JJ nonexecutive)"
    " (NN director))) (NP-TMP (NNP Nov.) (CD 29)))) (. .))",
    "( (S (NP-SBJ-1 (PRP It)) (VP (VBD was) (VP (VBN sold) (NP (-NONE- *-1)))) (. .)))",
    "(SINV (`` ``) (S-TPC-1 (NP (NNS Prices)) (VP (VBD fell))) (, ,) ('' '')"
    " (VP (VBD said) (S (-NONE- *T*-1))) (NP-SBJ (NNP Smith)) (. .))",
    "(NP (NP (NP (NN interest))) (PP=2 (IN in) (NP (NNS bonds))) (: --) (PRN (-LRB- -LRB-) (NP (CD 1))"
    " (-RRB- -RRB-)))",
    "(S (NP-SBJ (PRP He)) (VP (VBD gave) (PRT (RP up)) (SBAR (-NONE- 0) (S (-NONE- *T*-2)))) (. !))",
]


def _trees():
    return [T(text) for text in PTB_TREES]


# --- treebank input ------------------------------------------------------------------------------

def test_strip_empty_removes_traces_and_their_indices_but_keeps_function_tags():
    tree = strip_empty(T(PTB_TREES[2]))
    assert tree == T("( (S (NP-SBJ (PRP It)) (VP (VBD was) (VP (VBN sold))) (. .)))")
    assert strip_empty(T("(NP (-NONE- *))")) is None
    assert words(T(PTB_TREES[5])) == ["He", "gave", "up", "!"]
    assert tag_pos(T(PTB_TREES[5])) == ["PRP", "VBD", "RP", "."]


def test_load_treebank_reads_standard_wsj_sections(tmp_path, monkeypatch):
    monkeypatch.setattr(nltk.data, "path", list(nltk.data.path))
    for section, word in [("01", "skipped"), ("02", "first"), ("21", "last"), ("22", "dev"), ("23", "test")]:
        folder = tmp_path / section
        folder.mkdir()
        (folder / f"wsj_{section}00.mrg").write_text(
            f"( (S (NP-SBJ (NN {word})) (VP (-NONE- *?*)) (. .)) )\n")
    train = load_treebank("train", wsj_dir=str(tmp_path))
    assert [words(tree) for tree in train] == [["first", "."], ["last", "."]]
    assert train[0] == T("(S (NP-SBJ (NN first)) (. .))")
    assert [words(tree) for tree in load_treebank("dev", str(tmp_path))] == [["dev", "."]]
    assert [words(tree) for tree in load_treebank("test", str(tmp_path))] == [["test", "."]]


def test_load_treebank_errors_name_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(nltk.data, "path", list(nltk.data.path))
    with pytest.raises(ValueError, match="valid: train, dev, test"):
        load_treebank("valid")
    with pytest.raises(ParsingDataError, match="not a directory"):
        load_treebank("test", wsj_dir=str(tmp_path / "missing"))
    with pytest.raises(ParsingDataError, match="no wsj_"):
        load_treebank("test", wsj_dir=str(tmp_path))
    monkeypatch.setattr(nltk.data, "path", [])
    monkeypatch.delenv("NLTK_DATA", raising=False)
    monkeypatch.setenv("NLTK_DATA", str(tmp_path / "nltk_data"))
    with pytest.raises(ParsingDataError, match=rf"NLTK_DATA={tmp_path / 'nltk_data'}.*nltk.downloader "
                       "treebank.*--treebank") as e:
        load_treebank("dev")
    assert "\n" not in str(e.value)


@pytest.mark.skipif(not treebank_sample_present(), reason="NLTK's treebank sample not found (set NLTK_DATA)")
def test_sample_split_is_by_file_disjoint_and_counted():
    files = {split: set(sample_fileids(*SAMPLE_FILES[split])) for split in SPLITS}
    assert not files["train"] & files["dev"] and not files["train"] & files["test"]
    assert not files["dev"] & files["test"]
    assert set.union(*files.values()) == set(sample_fileids(1, 199))
    trees = {split: load_treebank(split) for split in SPLITS}
    assert {split: len(trees[split]) for split in SPLITS} == SAMPLE_SENTENCES
    dev = trees["dev"]
    assert all(tag != "-NONE-" for tree in dev for _, tag in tree.pos())
    restored = [delinearize(linearize(tree), words(tree), tag_pos(tree)) for tree in dev]
    assert bracket_f1(dev, restored) == 100.0


# --- linearization -------------------------------------------------------------------------------

def test_linearize_token_forms():
    tree = T(PTB_TREES[0])
    assert linearize(tree) == "(S (NP XX )NP (VP XX (NP XX XX )NP )VP XX )S".split()
    assert words(tree) == ["John", "has", "a", "dog", "."]
    assert linearize(T(PTB_TREES[2])) == "(TOP (S (NP XX )NP (VP XX (VP XX )VP )VP XX )S )TOP".split()
    assert linearize(tree, "tags") == "(S (NP NNP )NP (VP VBZ (NP DT NN )NP )VP . )S".split()
    assert linearize(tree, "words") == "(S (NP John )NP (VP has (NP a dog )NP )VP . )S".split()
    with pytest.raises(ValueError, match="one of tags, xx, words"):
        linearize(tree, "word")


@pytest.mark.parametrize("text", PTB_TREES)
def test_word_linearization_round_trips_and_any_word_fills_a_slot(text):
    tree = T(text)
    tokens, sentence = linearize(tree, "words"), words(tree)
    assert well_formed(tokens, len(sentence), "words")
    assert not well_formed(tokens, len(sentence))  # words are not slots of the tags/xx targets
    expected = normalize_tree(tree, keep_tags=True)
    assert delinearize(tokens, sentence, tag_pos(tree), "words") == expected
    # A wrong word still stands for the next input word; brackets are never words.
    wrong = ["dog" if t[0] not in "()" else t for t in tokens]
    assert delinearize(wrong, sentence, tag_pos(tree), "words") == expected
    assert not well_formed(tokens[:-1], len(sentence), "words")


@pytest.mark.parametrize("text", PTB_TREES)
def test_tag_linearization_round_trips_and_is_scored_like_xx(text):
    tree = T(text)
    tokens, sentence = linearize(tree, "tags"), words(tree)
    assert well_formed(tokens, len(sentence))
    assert delinearize(tokens, sentence, tag_pos(tree)) == normalize_tree(tree, keep_tags=True)
    # A tag is a word slot whatever tag it is: wrong tags cost no brackets.
    wrong = ["NN" if t in PTB_TAGS else t for t in tokens]
    assert delinearize(wrong, sentence, tag_pos(tree)) == normalize_tree(tree, keep_tags=True)
    assert [t for t in tokens if t in PTB_TAGS] == [t for t in tag_pos(tree) if t in PTB_TAGS]


@pytest.mark.parametrize("text", PTB_TREES)
def test_delinearize_inverts_linearize(text):
    tree = T(text)
    tokens, sentence = linearize(tree), words(tree)
    assert delinearize(tokens, sentence) == normalize_tree(tree)
    assert delinearize(tokens, sentence, tag_pos(tree)) == normalize_tree(tree, keep_tags=True)
    assert linearize(delinearize(tokens, sentence)) == tokens


def test_round_trip_against_hand_written_trees():
    tree = T(PTB_TREES[4])
    expected = T("(NP (NP (NP (XX interest))) (PP (XX in) (NP (XX bonds))) (XX --)"
                 " (PRN (XX -LRB-) (NP (XX 1)) (XX -RRB-)))")
    assert delinearize(linearize(tree), words(tree)) == expected
    tree = T(PTB_TREES[2])
    expected = T("(TOP (S (NP (PRP It)) (VP (VBD was) (VP (VBN sold))) (. .)))")
    assert delinearize(linearize(tree), words(tree), tag_pos(tree)) == expected


# --- repair of malformed output ------------------------------------------------------------------

SENTENCE = ["John", "has", "a", "dog", "."]


@pytest.mark.parametrize("output, expected", [
    ("", "(TOP (XX John) (XX has) (XX a) (XX dog) (XX .))"),
    ("(S (NP XX )NP (VP XX XX XX XX XX XX )VP XX )S",
     "(S (NP (XX John)) (VP (XX has) (XX a) (XX dog) (XX .)))"),
    ("(S (NP XX )NP (VP XX", "(TOP (S (NP (XX John)) (VP (XX has))) (XX a) (XX dog) (XX .))"),
    ("(S (NP XX )VP (VP XX (NP XX XX )S )VP XX )S",
     "(S (NP (XX John)) (VP (XX has) (NP (XX a) (XX dog))) (XX .))"),
    (")S )NP (S (NP XX )NP <unk> ( dog (VP XX XX XX XX )VP )S )S",
     "(S (NP (XX John)) (VP (XX has) (XX a) (XX dog) (XX .)))"),
    ("(S (NP )NP (ADJP (X )X )ADJP XX XX XX XX XX )S", "(S (XX John) (XX has) (XX a) (XX dog) (XX .))"),
    ("(NP XX XX )NP (VP XX XX XX )VP", "(TOP (NP (XX John) (XX has)) (VP (XX a) (XX dog) (XX .)))"),
    ("XX XX XX XX XX", "(TOP (XX John) (XX has) (XX a) (XX dog) (XX .))"),
])
def test_delinearize_repairs_malformed_output(output, expected):
    assert delinearize(output.split(), SENTENCE) == T(expected)


@pytest.mark.parametrize("output, ok", [
    ("(S (NP XX )NP (VP XX (NP XX XX )NP )VP XX )S", True),
    ("(S (NP XX )NP (VP XX (NP XX XX )NP )VP XX XX )S", False),   # one XX too many
    ("(S (NP XX )NP (VP XX (NP XX XX )NP )VP )S", False),         # one XX too few
    ("(S (NP XX )VP (VP XX (NP XX XX )NP )VP XX )S", False),      # closing label differs
    ("(S (NP XX )NP (VP XX (NP XX XX )NP )VP XX", False),         # unclosed
    ("(NP XX XX )NP (VP XX XX XX )VP", False),                    # two roots
    ("(S (NP )NP (NP XX XX )NP (VP XX XX XX )VP )S", False),      # an empty constituent
    ("(S (NP XX )NP <unk> (VP XX XX XX XX )VP )S", False),        # a stray token
    ("XX XX XX XX XX", False),
])
def test_well_formed_tells_when_output_needs_repair(output, ok):
    assert well_formed(output.split(), len(SENTENCE)) is ok
    if ok:
        assert linearize(delinearize(output.split(), SENTENCE)) == output.split()


def test_read_trees_from_a_file_or_a_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(nltk.data, "path", list(nltk.data.path))
    (tmp_path / "silver").mkdir()
    one = tmp_path / "silver" / "a.txt"
    one.write_text("(S (NP (NNS Cats)) (VP (VBP sleep)))\n( (S (NP (PRP It)) (VP (VBD was) "
                   "(NP (-NONE- *)))) )\n")
    (tmp_path / "silver" / "b.mrg").write_text("(NP (DT the) (NN end))\n")
    assert [words(t) for t in read_trees(str(one))] == [["Cats", "sleep"], ["It", "was"]]
    assert len(list(read_trees(str(tmp_path / "silver")))) == 3
    with pytest.raises(ParsingDataError, match="no such file or folder"):
        list(read_trees(str(tmp_path / "absent")))


def test_delinearize_restores_tags_on_repaired_output():
    tags = ["NNP", "VBZ", "DT", "NN", "."]
    expected = T("(TOP (S (NNP John)) (VBZ has) (DT a) (NN dog) (. .))")
    assert delinearize(["(S", "XX"], SENTENCE, tags) == expected
    with pytest.raises(ValueError, match="4 tags for 5 words"):
        delinearize([], SENTENCE, tags[:4])


def _corrupt(tokens: list[str], rng: random.Random) -> list[str]:
    """One random corruption a decoder could produce: shuffle, truncate, drop, insert, repeat."""
    junk = ["XX", "(NP", ")NP", "(VP", ")S", ")", "(", "<unk>", "dog", "(XX", ")XX"]
    tokens = list(tokens)
    kind = rng.randrange(5)
    if kind == 0:
        rng.shuffle(tokens)
    elif kind == 1:
        tokens = tokens[:rng.randrange(len(tokens) + 1)]
    elif kind == 2:
        tokens = [token for token in tokens if rng.random() > 0.3]
    elif kind == 3:
        for _ in range(rng.randrange(1, 8)):
            tokens.insert(rng.randrange(len(tokens) + 1), rng.choice(junk))
    else:
        tokens = tokens + tokens[:rng.randrange(len(tokens) + 1)]
    return tokens


def _is_preterminal(node: Tree) -> bool:
    return len(node) == 1 and isinstance(node[0], str)


def test_repair_always_yields_a_tree_over_exactly_the_words():
    rng = random.Random(0)
    gold = [strip_empty(tree) for tree in _trees()]
    for case in range(400):
        tree = gold[case % len(gold)]
        sentence, tags = words(tree), tag_pos(tree)
        repaired = delinearize(_corrupt(linearize(tree), rng), sentence, tags)
        assert repaired.leaves() == sentence
        assert repaired.pos() == list(zip(sentence, tags, strict=True))
        assert all(len(node) > 0 for node in repaired.subtrees())
        assert all(_is_preterminal(node) or all(isinstance(child, Tree) for child in node)
                   for node in repaired.subtrees())
        assert 0.0 <= evalb([tree], [repaired])["f1"] <= 100.0


# --- EVALB with COLLINS.prm -------------------------------------------------------------------------

def _score(gold: str, test: str) -> dict:
    return evalb([T(gold)], [T(test)])


def _prf(score: dict) -> tuple[float, float, float]:
    return tuple(round(score[key], 2) for key in ("precision", "recall", "f1"))


def test_evalb_perfect_match_is_100():
    # S(0,4) NP(0,1) VP(1,4) NP(2,4) after deleting "."; all 4 match: P = R = F1 = 100.
    score = _score(PTB_TREES[0], PTB_TREES[0])
    assert _prf(score) == (100.0, 100.0, 100.0)
    assert (score["matched"], score["gold_brackets"], score["test_brackets"]) == (4, 4, 4)


def test_evalb_pp_attachment_error():
    # Words: The man saw a dog with a telescope (0..8).
    # Gold: S(0,8) NP(0,2) VP(2,8) NP(3,5) PP(5,8) NP(6,8) = 6 brackets.
    # Test adds NP(3,8) = 7 brackets, all 6 gold ones matched.
    # P = 6/7 = 85.71, R = 6/6 = 100, F1 = 2*6/(6+7) = 92.31.
    gold = ("(S (NP (DT The) (NN man)) (VP (VBD saw) (NP (DT a) (NN dog))"
            " (PP (IN with) (NP (DT a) (NN telescope)))))")
    test = ("(S (NP (DT The) (NN man)) (VP (VBD saw) (NP (NP (DT a) (NN dog))"
            " (PP (IN with) (NP (DT a) (NN telescope))))))")
    assert _prf(_score(gold, test)) == (85.71, 100.0, 92.31)


def test_evalb_strips_function_tags_and_indices():
    # NP-SBJ-1 -> NP, PP-LOC=2 -> PP, S-TPC -> S: gold S(0,3) NP(0,1) VP(1,3) PP(2,3) all match: 100.
    gold = "(S-TPC (NP-SBJ-1 (PRP We)) (VP (VBD sat) (PP-LOC=2 (RB here))))"
    test = "(S (NP (PRP We)) (VP (VBD sat) (PP (RB here))))"
    assert _prf(_score(gold, test)) == (100.0, 100.0, 100.0)
    # The POS tags are not brackets: different tags do not change the bracket score.
    assert _prf(_score(gold, test.replace("RB", "IN"))) == (100.0, 100.0, 100.0)
    # Raw trees with traces score like stripped ones: -NONE- words go, NP(*-1) is left empty.
    raw = T(PTB_TREES[2])
    assert bracket_f1([raw], [strip_empty(raw)]) == 100.0


def test_evalb_deletes_punctuation_so_spans_shift():
    # Words after deleting , and . : John left (0..2). Gold S(0,2) NP(0,1) VP(1,2).
    # Test attaches the comma inside VP and the period inside NP: raw spans differ, but after
    # deletion they are the same three brackets: P = R = F1 = 100 (raw spans would give 1/3).
    gold = "(S (NP (NNP John)) (, ,) (VP (VBD left)) (. .))"
    test = "(S (NP (NNP John) (. .)) (VP (, ,) (VBD left)))"
    assert _prf(_score(gold, test)) == (100.0, 100.0, 100.0)
    # Tags ``, '' and : go too, "#" and "$" stay: gold S(0,2) NP(0,1) VP(1,2) against test
    # S(0,2) NP(0,2) -> P = 1/2 = 50, R = 1/3 = 33.33, F1 = 2/5 = 40.
    gold = "(S (`` ``) (NP ($ $)) (: ;) (VP (VBD paid)) ('' ''))"
    test = "(S (`` ``) (NP ($ $) (: ;) (VBD paid)) ('' ''))"
    assert _prf(_score(gold, test)) == (50.0, 33.33, 40.0)


def test_evalb_deletes_top_and_the_unlabelled_root():
    # Gold "( (S ...))" and test "(TOP (S ...))" both count only S(0,2) NP(0,1) VP(1,2): 100.
    gold = "( (S (NP (PRP it)) (VP (VBZ works))))"
    assert _prf(_score(gold, "(TOP (S (NP (PRP it)) (VP (VBZ works))))")) == (100.0, 100.0, 100.0)
    assert _prf(_score(gold, "(S (NP (PRP it)) (VP (VBZ works)))")) == (100.0, 100.0, 100.0)
    # A root wrapping two phrases: gold NP(0,1) VP(1,2); test VP(0,2) VP(1,2): P = R = F1 = 50.
    gold = "( (NP (PRP it)) (VP (VBZ works)))"
    assert _prf(_score(gold, "(TOP (VP (PRP it) (VP (VBZ works))))")) == (50.0, 50.0, 50.0)


def test_evalb_counts_repeated_brackets_as_a_multiset():
    # Gold: S(0,2) NP(0,1) NP(0,1) VP(1,2) = 4 (unary chain NP over NP); test: S NP VP = 3.
    # Only one NP(0,1) can be matched: matched 3, P = 3/3 = 100, R = 3/4 = 75, F1 = 150/175 = 85.71.
    gold = "(S (NP (NP (NNS dogs))) (VP (VBP bark)))"
    test = "(S (NP (NNS dogs)) (VP (VBP bark)))"
    score = _score(gold, test)
    assert _prf(score) == (100.0, 75.0, 85.71)
    assert (score["matched"], score["gold_brackets"], score["test_brackets"]) == (3, 4, 3)
    # Swapped: P = 75, R = 100; the same chain on both sides matches twice: 100.
    assert _prf(_score(test, gold)) == (75.0, 100.0, 85.71)
    assert _prf(_score(gold, gold)) == (100.0, 100.0, 100.0)


def test_evalb_treats_advp_and_prt_as_equal():
    # Gold S(0,3) NP(0,1) VP(1,3) PRT(2,3); test has ADVP(2,3): EQ_LABEL ADVP PRT -> 4/4 = 100.
    gold = "(S (NP (PRP He)) (VP (VBD gave) (PRT (RP up))))"
    test = "(S (NP (PRP He)) (VP (VBD gave) (ADVP (RB up))))"
    assert _prf(_score(gold, test)) == (100.0, 100.0, 100.0)
    # Other labels stay distinct: ADJP(2,3) misses, 3/4 each way = 75.
    assert _prf(_score(gold, test.replace("ADVP", "ADJP"))) == (75.0, 75.0, 75.0)


def test_evalb_drops_a_bracket_covering_only_punctuation():
    # Gold X covers only "." -> empty after deletion, not counted: gold S(0,2) NP(0,1) VP(1,2) = 3;
    # test has the same 3: 100 (counting X would give R = 3/4).
    gold = "(S (NP (NNP John)) (VP (VBD left)) (X (. .)))"
    test = "(S (NP (NNP John)) (VP (VBD left) (. .)))"
    assert _prf(_score(gold, test)) == (100.0, 100.0, 100.0)
    assert evalb_brackets(T(gold))[1] == {("S", 0, 2): 1, ("NP", 0, 1): 1, ("VP", 1, 2): 1}


def test_evalb_sums_counts_over_the_corpus():
    # Sentence 1: 4 of 4 brackets; sentence 2: matched 3, gold 4, test 3 (multiset case).
    # Corpus P = 7/7 = 100, R = 7/8 = 87.5, F1 = 2*100*87.5/187.5 = 93.33 (not the mean of F1s).
    gold = [T(PTB_TREES[0]), T("(S (NP (NP (NNS dogs))) (VP (VBP bark)))")]
    test = [T(PTB_TREES[0]), T("(S (NP (NNS dogs)) (VP (VBP bark)))")]
    score = evalb(gold, test)
    assert _prf(score) == (100.0, 87.5, 93.33)
    assert score["sentences"] == 2
    assert bracket_f1(gold, test) == score["f1"]


def test_evalb_length_mismatch_names_the_sentence():
    # With XX tags the test keeps "." as a word: 5 words against the gold's 4.
    gold = [T(PTB_TREES[0]), T(PTB_TREES[0])]
    tree = gold[1]
    test = [gold[0], delinearize(linearize(tree), words(tree))]
    with pytest.raises(ValueError, match="sentence 1: length mismatch"):
        evalb(gold, test)
    test[1] = delinearize(linearize(tree), words(tree), tag_pos(tree))
    assert evalb(gold, test)["f1"] == 100.0
