"""The Lightning data module: one corpus, encoded with a shared tokenizer, in token-bucketed
batches dealt to the ranks of a run."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from reproduce.data.batching import (
    PAD_BATCH,
    BatchStream,
    Encoded,
    Packed,
    ResumableLoader,
    Shapes,
    batch_by_shapes,
    batch_by_tokens,
    shape_census,
    source_tensor,
)
from reproduce.data.corpora import corpus_spec
from reproduce.data.encoded_cache import EncodedCorpus, encoded_corpus
from reproduce.data.ngram import ngram_perplexities
from reproduce.data.source import CorpusSource
from reproduce.errors import DataError

if TYPE_CHECKING:
    from reproduce.config import Config
    from reproduce.paper.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

LOADER_WORKERS_ENV = "REPRODUCE_LOADER_WORKERS"


class TranslationData(pl.LightningDataModule):
    """Token-bucketed batches of one corpus, encoded with a shared tokenizer.

    ``setup`` maps the corpus encoded once under ``cache_dir`` (``reproduce.data.encoded_cache``; every
    rank of a run maps the same pages), or encodes it in memory when ``cache_dir`` is None.
    ``source`` is the corpus as already read by the caller (to train the tokenizer), if it was.
    Batches are dicts of LongTensors padded with 0: ``src`` (B, S) = pieces + EOS, ``tgt_in``
    (B, T) = BOS + pieces and ``tgt_out`` (B, T) = pieces + EOS. Training pairs whose source or
    target sequence is longer than ``max_tokens_per_sentence`` are dropped (``self.dropped``);
    dev pairs are all kept. ``dev_pairs`` and ``test_pairs`` hold the raw strings for BLEU.
    """

    def __init__(self, config: Config, tokenizer: Tokenizer, cache_dir: str | Path | None = None,
                 source: CorpusSource | None = None):
        super().__init__()
        d, t = config.data, config.train  # checked by the config; what it cannot know is below
        corpus_spec(d.corpus)
        if t.max_tokens_per_sentence < 2:
            raise DataError(
                f"max_tokens_per_sentence must be at least 2 (a piece and EOS), got"
                f" {t.max_tokens_per_sentence}"
            )
        if tokenizer.pad_id != 0:
            raise DataError(
                f"tokenizer pad_id must be 0 (batches are padded with 0); it is {tokenizer.pad_id}"
            )
        self.corpus = d.corpus
        self.tokenizer = tokenizer
        self.train_config = t  # its batch: micro_batch_tokens
        self.max_tokens_per_sentence = t.max_tokens_per_sentence
        self.seed = t.seed
        self.max_train_pairs = d.max_train_pairs or None  # 0 in a config: all
        self.max_eval_pairs = d.max_eval_pairs or None
        self.train_every = d.train_every
        self.cache_dir = cache_dir
        self.source = source or CorpusSource(d.corpus, d.data_dir or None, d.extra_trees or None,
                                             d.linearization)
        self.dropped = 0
        self.sha256: dict[str, str] = {}  # per split, of the pairs used (``pairs_sha256``)
        self.dev_pairs: list[tuple[str, str]] = []
        self.test_pairs: list[tuple[str, str]] = []
        self._train: Encoded | None = None
        self._dev: Encoded | None = None
        self._corpus: EncodedCorpus | None = None
        self._batch_counts: dict[tuple[int, bool, int, int, int, int], int] = {}
        self._fitted: dict[tuple[int, int, int], Shapes] = {}

    def setup(self, stage: str | None = None) -> None:
        """Map (or encode) the splits; later calls (one per Lightning stage) do nothing."""
        if self._train is not None:
            return
        corpus = encoded_corpus(self.source, self.tokenizer, self.train_every,
                                self.max_train_pairs, self.max_eval_pairs, self.cache_dir)
        self._corpus = corpus
        self.dev_pairs, self.test_pairs, self.sha256 = (corpus.dev_pairs, corpus.test_pairs,
                                                        corpus.sha256)
        encoded = corpus.train
        fits = (encoded.lengths <= self.max_tokens_per_sentence).all(axis=1)
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
        self._train = encoded.subset(np.flatnonzero(fits)) if self.dropped else encoded
        self._dev = corpus.dev

    def reference_perplexities(self) -> dict[str, float]:
        """Dev PPL of unigram and bigram count models of the training targets (same pieces),
        computed once per encoded corpus and length limit."""
        if self._corpus is None:
            raise RuntimeError("TranslationData.setup() must run before reference_perplexities")
        return self._corpus.remember(
            f"reference_ppl-{self.max_tokens_per_sentence}",
            lambda: ngram_perplexities(self._ready(self._train).tgt, self._ready(self._dev).tgt,
                                       self.tokenizer.vocab_size, self.tokenizer.bos_id,
                                       self.tokenizer.eos_id))

    @property
    def cache_folder(self) -> Path | None:
        """Where the encoded corpus is mapped from (None: encoded in memory, or not set up)."""
        return None if self._corpus is None else self._corpus.folder

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

    @property
    def train_sample_pairs(self) -> int:
        """How many training pairs ``train_sample_dataloader`` scores: as many as dev has."""
        return min(self.num_train_pairs, len(self._ready(self._dev)))

    def train_sample_dataloader(self) -> DataLoader:
        """Batches of a fixed sample of the training pairs (``train_sample_pairs``), short to
        long: the final weights' NLL on it beside dev's tells fitting from generalizing. The
        sample is drawn with one seed for every run of a corpus, so variants and seeds score the
        same pairs."""
        train = self._ready(self._train)
        pick = np.sort(np.random.default_rng(0).choice(len(train), size=self.train_sample_pairs,
                                                       replace=False))
        return self._loader(train.subset(pick), shuffle=False)

    def source_batches(
        self, sources: list[str], batch_tokens: int
    ) -> Iterator[tuple[list[int], torch.Tensor]]:
        """(indices into ``sources``, padded source tensor) batches, grouped by length to decode."""
        packed = Packed.encode(self.tokenizer, sources)
        lengths = np.stack([packed.lengths + 1, np.zeros_like(packed.lengths)], axis=1)
        for indices in batch_by_tokens(lengths, batch_tokens, shuffle=False, seed=0):
            index = np.asarray(indices, dtype=np.int64)
            yield indices, source_tensor(packed, index, self.tokenizer.eos_id)

    def _loader(self, data: Encoded, shuffle: bool) -> DataLoader:
        bos, eos = self.tokenizer.bos_id, self.tokenizer.eos_id
        stream = BatchStream(
            plan=lambda epoch: self._plan(data, shuffle, epoch),
            collate=lambda indices: (data.batch(indices, bos, eos) if indices
                                     else {PAD_BATCH: torch.ones(1)}),
            epoch_of=lambda: None if self.trainer is None else self.trainer.current_epoch,
            count=lambda: self._count(data, shuffle),
        )
        if not shuffle:  # evaluation passes run whole, in this process: a few batches
            return DataLoader(stream, batch_size=None, num_workers=0,
                              pin_memory=torch.cuda.is_available())
        return ResumableLoader(stream, done=self._trained_in_epoch, workers=self.loader_workers)

    @property
    def loader_workers(self) -> int:
        """DataLoader processes that collate training batches: ``$REPRODUCE_LOADER_WORKERS``,
        else 2 beside a GPU (so it never waits on a batch) and none on a CPU, where collation is a
        few tensor ops per batch and a worker would take a core from the training step."""
        value = os.environ.get(LOADER_WORKERS_ENV, "")
        if value:
            if not value.isdigit():
                raise DataError(f"{LOADER_WORKERS_ENV}={value!r}: a number of worker processes"
                                " (0: collate in the training process)")
            return int(value)
        return 2 if torch.cuda.is_available() else 0

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

    def _plan(self, data: Encoded, shuffle: bool, epoch: int) -> list[list[int]]:
        """Training: this rank's share of the epoch's shuffled batches. Evaluation on several
        ranks: every batch exactly once, dealt round-robin; ranks left a batch short get an empty
        one (``PAD_BATCH``, skipped by ``validation_step``) so all run the same number of steps."""
        rank, world_size = self._rank()
        seed = int(np.random.SeedSequence([self.seed, epoch]).generate_state(1)[0])
        if shuffle and self.train_config.batch_shapes:
            return batch_by_shapes(data.lengths, self._shapes(data), shuffle, seed, rank,
                                   world_size)
        if shuffle or world_size == 1:
            return batch_by_tokens(data.lengths, self.micro_batch_tokens, shuffle, seed, rank,
                                   world_size)
        every = batch_by_tokens(data.lengths, self.micro_batch_tokens, False, seed)
        mine = every[rank::world_size]
        return mine + [[]] * (-(-len(every) // world_size) - len(mine))

    def _shapes(self, data: Encoded) -> Shapes:
        """The ``train.batch_shapes`` shapes training batches take, fitted once to ``data``."""
        key = (id(data), self.micro_batch_tokens, self.train_config.batch_shapes)
        if key not in self._fitted:
            self._fitted[key] = Shapes.fit(data.lengths, self.train_config.batch_shapes,
                                           self.micro_batch_tokens)
        return self._fitted[key]

    def batch_shape_census(self) -> dict[str, float]:
        """An epoch's training batches on this rank: how many, in how many distinct shapes, and
        the share of their tensors' positions (both sides) that are padding
        (``reproduce.data.batching.shape_census``)."""
        train = self._ready(self._train)
        return shape_census(self._plan(train, True, epoch=0), train.lengths)

    def _count(self, data: Encoded, shuffle: bool) -> int:
        # The count depends only on the sorted lengths, not on the epoch's shuffle: memoise it.
        key = (id(data), shuffle, self.micro_batch_tokens, self.train_config.batch_shapes,
               *self._rank())
        if key not in self._batch_counts:
            self._batch_counts[key] = len(self._plan(data, shuffle, epoch=0))
        return self._batch_counts[key]

    @property
    def micro_batch_tokens(self) -> int:
        """Tokens per batch on one device: the config's ``batch_tokens`` split over the ranks and,
        past ``device_batch_tokens``, over accumulated micro-batches (``TrainConfig.split_batch``,
        as the Trainer accumulates them)."""
        world_size = self._rank()[1]
        return self.train_config.split_batch(world_size)[1]

    def _rank(self) -> tuple[int, int]:
        if self.trainer is None:
            return 0, 1
        return self.trainer.global_rank, self.trainer.world_size

    def _ready(self, data: Encoded | None) -> Encoded:
        if data is None:
            raise RuntimeError("TranslationData.setup() must run before its dataloaders")
        return data
