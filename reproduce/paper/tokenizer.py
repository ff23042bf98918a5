"""A shared source-target BPE vocabulary (section 5.1), trained with sentencepiece and cached.

One model is trained per (corpus content, vocabulary size) and kept under ``<cache>/spm/``; later runs load
the file instead of retraining, so every experiment on a corpus sees the same segmentation.

A second kind, one token a word (``WordTokenizer``, ``data.vocabulary: words``), is a small
treebank's stand-in for the paper's 16K pieces on WSJ, nearly one piece a word there: on NLTK's
sample a 4000-piece BPE splits a quarter of the dev words. Each training word seen at least twice
(the most frequent, up to the budget) is its own token; every other word, seen once in training
or never, is written as its shape (``word_shape``: ``<unk-Cap-s>``), whose tokens the words seen
once train.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm

from reproduce.errors import DataError
from reproduce.util.files import write_atomic

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3

# Past this many sentences sentencepiece trains on a seeded random sample: BPE training time and
# memory grow with the input, and a few million sentences already give stable merges.
MAX_TRAINING_SENTENCES = 2_000_000

WORD_MODEL = 3  # sentencepiece's TrainerSpec.ModelType.WORD
SHAPE_SUFFIXES = ("ing", "ed", "ly", "ion", "er", "est", "s")  # after Petrov et al.'s signatures

_VOCAB_TOO_HIGH = re.compile(r"[Vv]ocabulary size (?:is )?too high.*?<=\s*(\d+)")



class Tokenizer:
    """A sentencepiece model with the ids the models assume: pad=0, unk=1, bos=2, eos=3."""

    def __init__(self, processor: spm.SentencePieceProcessor, path: Path | None = None):
        expected = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
        found = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
        if found != expected:
            raise DataError(
                f"tokenizer {path or '<in memory>'}: special ids (pad, unk, bos, eos) are {found},"
                f" expected {expected}"
            )
        self._sp = processor
        self.path = path

    @property
    def sha256(self) -> str:
        """A fingerprint of the vocabulary: SHA-256 of the serialized sentencepiece model."""
        return hashlib.sha256(self._sp.serialized_model_proto()).hexdigest()

    @property
    def vocab_size(self) -> int:
        """Number of pieces, special symbols included."""
        return self._sp.get_piece_size()

    @property
    def pad_id(self) -> int:
        """Padding id (0)."""
        return PAD_ID

    @property
    def unk_id(self) -> int:
        """Unknown-piece id (1)."""
        return UNK_ID

    @property
    def bos_id(self) -> int:
        """Begin-of-sentence id (2), prepended to decoder inputs."""
        return BOS_ID

    @property
    def eos_id(self) -> int:
        """End-of-sentence id (3), appended to sources and decoder targets."""
        return EOS_ID

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Piece ids for each text, without BOS or EOS."""
        if isinstance(texts, str):
            # sentencepiece would silently return one flat list for a bare string.
            raise TypeError("Tokenizer.encode takes a list of strings, not a single string")
        return self._sp.encode(list(texts), out_type=int, num_threads=_threads())

    def decode(self, ids: list[list[int]]) -> list[str]:
        """Detokenized text for each id sequence; pad, BOS and EOS decode to nothing."""
        return self._sp.decode([list(map(int, seq)) for seq in ids])

    def piece(self, i: int) -> str:
        """The piece with id ``i`` as sentencepiece writes it (``▁`` marks a word start)."""
        return self._sp.id_to_piece(int(i))

    def pieces(self) -> list[str]:
        """Every piece, indexed by id."""
        return [self._sp.id_to_piece(i) for i in range(self.vocab_size)]

    def __repr__(self) -> str:
        return f"Tokenizer(path={str(self.path)!r}, vocab_size={self.vocab_size})"


class WordTokenizer(Tokenizer):
    """One token a word: the word's own where the vocabulary has it, else its shape's."""

    def __init__(self, processor: spm.SentencePieceProcessor, path: Path | None = None):
        super().__init__(processor, path)
        self.known = frozenset(p[1:] for p in self.pieces() if p.startswith("\u2581"))

    def token(self, word: str) -> str:
        """What ``word`` is written as: itself, or ``word_shape(word)``."""
        return word if word in self.known else word_shape(word)

    def encode(self, texts: list[str]) -> list[list[int]]:
        if isinstance(texts, str):
            raise TypeError("Tokenizer.encode takes a list of strings, not a single string")
        return super().encode([" ".join(map(self.token, text.split())) for text in texts])


def word_shape(word: str) -> str:
    """The token of a word the vocabulary lacks: what it looks like (digits, capitalized, all
    capitals or lower case, a hyphen, a common suffix), ``<unk-Cap-s>`` for ``Mondays``. A shape
    no training word had is sentencepiece's ``<unk>``, one token too."""
    parts = ["unk"]
    if any(ch.isdigit() for ch in word):
        parts.append("num")
    if word[:1].isupper():
        parts.append("CAPS" if word.isupper() and len(word) > 1 else "Cap")
    elif any(ch.isupper() for ch in word):
        parts.append("mixed")
    else:  # never bare: sentencepiece's own unknown piece is <unk>
        parts.append("low")
    if "-" in word:
        parts.append("dash")
    lower = word.lower()
    parts += [s for s in SHAPE_SUFFIXES if lower.endswith(s) and len(lower) > len(s) + 2][:1]
    return "<" + "-".join(parts) + ">"


def words_text(texts: Iterable[str], budget: int, symbols: Sequence[str] = ()) -> list[str]:
    """``texts`` as a word vocabulary is trained on: the ``budget`` most frequent words seen at
    least twice kept (``symbols`` always), every other word written as its shape."""
    texts = [t for t in texts if t]
    counts = Counter(w for t in texts for w in t.split())
    keep = {s.lstrip("\u2581") for s in symbols}
    shapes = {word_shape(w) for w in counts if w not in keep}  # at most this many shape tokens
    room = max(0, budget - 4 - len(keep) - len(shapes))  # 4: pad, unk, bos, eos
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    keep |= set([w for w, n in ranked if n >= 2 and w not in keep][:room])
    return [" ".join(w if w in keep else word_shape(w) for w in t.split()) for t in texts]


def word_coverage(tokenizer: Tokenizer, sentences: Sequence[str], kind: str) -> dict[str, Any]:
    """How ``tokenizer`` (a vocabulary of ``kind``) writes the words of ``sentences`` (a dev
    split's sources): ``one_token``, the percentage it writes as one token; ``own_token``, as a
    token of their own (not a word's shape, nor ``<unk>``)."""
    words = [w for s in sentences for w in s.split()]
    ids = tokenizer.encode(words)
    one = sum(len(i) == 1 for i in ids)
    own = (sum(w in tokenizer.known for w in words) if isinstance(tokenizer, WordTokenizer)
           else sum(len(i) == 1 and i[0] != UNK_ID for i in ids))
    share = (lambda n: round(100 * n / len(words), 2)) if words else (lambda n: 0.0)
    return {"kind": kind, "dev_words": len(words), "one_token": share(one),
            "own_token": share(own),
            "other_words": ("written as their shape (<unk-Cap-s>)" if kind == "words" else
                            "split into pieces")}


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a sentencepiece ``.model`` file written by :func:`train_tokenizer`: a
    ``WordTokenizer`` where it is a word model."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"tokenizer model not found: {path}")
    processor = spm.SentencePieceProcessor(model_file=str(path))
    return (WordTokenizer if _model_type(processor) == WORD_MODEL else Tokenizer)(processor, path)


def _model_type(processor: spm.SentencePieceProcessor) -> int:
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]
    proto.ParseFromString(processor.serialized_model_proto())
    return proto.trainer_spec.model_type


def model_path(corpus: str, vocab_size: int, cache_dir: str | Path, kind: str = "bpe") -> Path:
    """Where the model of ``kind`` (``bpe``, ``words``) for ``corpus`` and ``vocab_size`` is
    cached."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in corpus)
    return Path(cache_dir) / "spm" / f"{safe}-{kind}{vocab_size}.model"


def train_tokenizer(
    corpus: str,
    vocab_size: int,
    texts: Iterable[str],
    cache_dir: str | Path,
    symbols: Sequence[str] = (),
    hard_vocab_limit: bool = True,
    kind: str = "bpe",
) -> Tokenizer:
    """A shared source+target BPE model named ``corpus``, trained once and then loaded from cache.

    ``texts`` should hold both sides of the training split. The cache key is only (``corpus``,
    vocab_size): a second call returns the cached model whatever ``texts`` it is given, so
    ``corpus`` must name the text's content (``reproduce.data.vocabulary`` passes the corpus's
    fingerprint).
    ``symbols`` are pieces kept whole wherever they occur (the parser's ``▁(NP``, ``▁XX``). With
    ``hard_vocab_limit=False`` a text too small for ``vocab_size`` gets a smaller vocabulary
    instead of an error (``Tokenizer.vocab_size`` is the real size). ``kind="words"``: one token
    a word (``WordTokenizer``), ``vocab_size`` its budget.
    """
    if vocab_size < 8:
        raise DataError(f"vocab_size must be at least 8 (4 special ids + pieces), got {vocab_size}")
    path = model_path(corpus, vocab_size, cache_dir, kind)
    if path.is_file():
        return load_tokenizer(path)
    if kind == "words":
        texts = words_text(texts, vocab_size, symbols)
    model = _train(texts, vocab_size, corpus, tuple(symbols), hard_vocab_limit and kind != "words",
                   "word" if kind == "words" else "bpe")
    write_atomic(path, model)
    return load_tokenizer(path)


def _train(texts: Iterable[str], vocab_size: int, corpus: str, symbols: tuple[str, ...] = (),
           hard_vocab_limit: bool = True, model_type: str = "bpe") -> bytes:
    """The serialized model. Trained in memory, so the file holds no temporary paths."""
    model = io.BytesIO()
    # Sampling beyond MAX_TRAINING_SENTENCES is the only randomness in BPE training.
    spm.set_random_generator_seed(0)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=(t for t in texts if t),
            model_writer=model,
            model_type=model_type,
            vocab_size=vocab_size,
            character_coverage=1.0,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            input_sentence_size=MAX_TRAINING_SENTENCES,
            shuffle_input_sentence=True,
            num_threads=_threads(),
            minloglevel=2,
            user_defined_symbols=list(symbols),
            hard_vocab_limit=hard_vocab_limit,
        )
    except RuntimeError as exc:
        too_high = _VOCAB_TOO_HIGH.search(str(exc))
        if too_high is None:
            raise
        raise DataError(
            f"vocab_size {vocab_size} is too large for the {corpus!r} training text: sentencepiece"
            f" allows at most {too_high.group(1)}; use a smaller vocab_size or more text"
        ) from exc
    return model.getvalue()


def _threads() -> int:
    return max(1, min(os.cpu_count() or 1, 16))
