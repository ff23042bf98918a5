"""One token a word (``data.vocabulary: words``, ``paper.tokenizer.WordTokenizer``): frequent
words their own token, every other word its shape, both sides alike, and the share a record
states."""

import pytest

from reproduce.config import Config
from reproduce.errors import ConfigError
from reproduce.paper.tokenizer import (
    UNK_ID,
    WordTokenizer,
    load_tokenizer,
    train_tokenizer,
    word_coverage,
    word_shape,
)

TEXTS = ["The dog saw the cat", "(S (NP DT NN )NP )S", "The cat saw Mondays ,", "the dog ran",
         "Prices fell 3.5 % ,", "(S (NP DT NN )NP )S"]


@pytest.mark.parametrize("word, shape", [
    ("Mondays", "<unk-Cap-s>"), ("deluge", "<unk-low>"), ("IBM", "<unk-CAPS>"),
    ("3.5", "<unk-num-low>"), ("well-known", "<unk-low-dash>"), ("running", "<unk-low-ing>"),
    ("iPhone", "<unk-mixed>"), ("is", "<unk-low>")])
def test_a_word_s_shape_says_what_it_looks_like_and_is_never_sentencepiece_s_unk(word, shape):
    assert word_shape(word) == shape != "<unk>"


def test_every_word_is_one_token_its_own_where_seen_twice_else_its_shape(tmp_path):
    tok = train_tokenizer("toy", 100, iter(TEXTS), tmp_path, symbols=["\u2581(S", "\u2581)S"],
                          kind="words")
    assert isinstance(tok, WordTokenizer) and isinstance(load_tokenizer(tok.path), WordTokenizer)
    assert tok.path.name == "toy-words100.model"
    sentence = "The cat saw Mondays and a zebra"
    ids = tok.encode([sentence])[0]
    assert len(ids) == len(sentence.split()) and UNK_ID not in ids[:3]
    assert tok.decode([ids])[0] == "The cat saw <unk-Cap-s> <unk-low> <unk-low> <unk-low>"
    assert {"The", "cat", "saw", "(S", "(NP"} <= tok.known and "Mondays" not in tok.known
    coverage = word_coverage(tok, [sentence], "words")
    assert coverage["one_token"] == 100 and coverage["own_token"] == round(300 / 7, 2)
    # a budget smaller than the words keeps the most frequent, and the symbols always
    small = train_tokenizer("toy", 30, iter(TEXTS), tmp_path, symbols=["\u2581(S", "\u2581)S"],
                            kind="words")
    assert small.vocab_size <= 30 and {"(S", ")S", "the"} <= small.known


def test_a_bpe_vocabulary_states_its_share_too(tmp_path):
    tok = train_tokenizer("toy", 60, iter(TEXTS * 3), tmp_path, hard_vocab_limit=False)
    assert not isinstance(tok, WordTokenizer) and tok.path.name == "toy-bpe60.model"
    coverage = word_coverage(tok, ["The dog zebraic"], "bpe")
    assert coverage["kind"] == "bpe" and coverage["one_token"] < 100


def test_an_unknown_vocabulary_kind_is_one_line():
    with pytest.raises(ConfigError, match=r"data.vocabulary = 'wordz': one of bpe, words"):
        Config().overrides(vocabulary="wordz")
