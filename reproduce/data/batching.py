"""Section 5.1's batches: sentence pairs grouped by length, each batch at most a number of padded
tokens, packed into tensors, streamed so that a run resumes mid-epoch on the batch it stopped at."""

from __future__ import annotations

import itertools
import multiprocessing
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from reproduce.data.token_file import TokenFile

if TYPE_CHECKING:
    from reproduce.paper.tokenizer import Tokenizer

# The batch streams below deal their batches to DataLoader workers themselves, so their __len__ is
# exact; Lightning's warning about IterableDatasets with a length and worker duplicates does not
# apply.
warnings.filterwarnings(
    "ignore", message="Your `IterableDataset` has `__len__`", category=UserWarning
)


PAD_BATCH = "pad_batch"  # the key of an evaluation batch that only keeps ranks in step


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
class Packed:
    """Many token sequences in one flat array, so a batch is gathered without Python loops.

    From the encoded-corpus cache (``reproduce.data.encoded_cache``) ``starts`` and ``lengths`` are
    memory maps and ``tokens`` a ``TokenFile``, read a batch at a time (``reproduce.data.token_file``
    says why): every run and every rank then reads the same pages of the kernel's page cache."""

    tokens: np.ndarray | TokenFile  # (total,) int32 piece ids, sequences back to back
    starts: np.ndarray  # (n,) int64 offset of each sequence in tokens
    lengths: np.ndarray  # (n,) int64 number of pieces, without BOS/EOS

    @classmethod
    def encode(cls, tokenizer: Tokenizer, texts: Sequence[str], chunk: int = 65536) -> Packed:
        """Encode ``texts`` in chunks, so peak memory holds one chunk's Python lists."""
        flat, lengths = [], []
        for begin in range(0, len(texts), chunk):
            ids = tokenizer.encode(list(texts[begin : begin + chunk]))
            lengths.append(np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)))
            flat.append(np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32))
        lens = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
        starts = np.cumsum(lens) - lens
        tokens = np.concatenate(flat) if flat else np.zeros(0, dtype=np.int32)
        return cls(tokens, starts, lens)

    def __len__(self) -> int:
        return len(self.lengths)

    def subset(self, index: np.ndarray) -> Packed:
        """The sequences at ``index`` (the flat token store is shared, not copied)."""
        return Packed(self.tokens, self.starts[index], self.lengths[index])

    def pieces(self, index: np.ndarray | slice) -> np.ndarray:
        """The pieces of the sequences at ``index``, back to back."""
        starts, lengths = self.starts[index], self.lengths[index]
        if isinstance(self.tokens, TokenFile):
            return self.tokens.gather(starts, lengths)
        within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        return self.tokens[np.repeat(starts, lengths) + within]

    def rows(self, index: np.ndarray, width: int, offset: int) -> torch.Tensor:
        """(len(index), width) ids: each sequence starts at column ``offset``, the rest is pad 0."""
        inside = np.arange(width - offset) < self.lengths[index][:, None]
        out = np.zeros((len(index), width), dtype=np.int64)
        out[:, offset:][inside] = self.pieces(index)
        return torch.from_numpy(out)


def source_tensor(src: Packed, index: np.ndarray, eos: int) -> torch.Tensor:
    """Padded source sequences: pieces + EOS."""
    lengths = src.lengths[index]
    out = src.rows(index, int(lengths.max()) + 1, offset=0)
    out[torch.arange(len(index)), torch.from_numpy(lengths)] = eos
    return out


@dataclass(frozen=True)
class Encoded:
    """Encoded sentence pairs and their model-side lengths (pieces + 1 for EOS or BOS)."""

    src: Packed
    tgt: Packed

    @classmethod
    def encode(cls, tokenizer: Tokenizer, pairs: Sequence[tuple[str, str]]) -> Encoded:
        """Encode both sides of ``pairs``."""
        return cls(Packed.encode(tokenizer, [s for s, _ in pairs]),
                   Packed.encode(tokenizer, [t for _, t in pairs]))

    def __len__(self) -> int:
        return len(self.src)

    @property
    def lengths(self) -> np.ndarray:
        """(N, 2) sequence lengths as the model sees them: source + EOS, target + BOS/EOS."""
        return np.stack([self.src.lengths, self.tgt.lengths], axis=1) + 1

    def subset(self, index: np.ndarray) -> Encoded:
        """The pairs at ``index``."""
        return Encoded(self.src.subset(index), self.tgt.subset(index))

    def batch(self, indices: Sequence[int], bos: int, eos: int) -> dict[str, torch.Tensor]:
        """Padded ``src`` (pieces + EOS), ``tgt_in`` (BOS + pieces), ``tgt_out`` (pieces + EOS)."""
        index = np.asarray(indices, dtype=np.int64)
        rows = torch.arange(len(index))
        tgt_lengths = self.tgt.lengths[index]
        width = int(tgt_lengths.max()) + 1
        tgt_in = self.tgt.rows(index, width, offset=1)
        tgt_in[:, 0] = bos
        tgt_out = torch.zeros_like(tgt_in)  # the same pieces one column left: read once
        tgt_out[:, :-1] = tgt_in[:, 1:]
        tgt_out[rows, torch.from_numpy(tgt_lengths)] = eos
        return {"src": source_tensor(self.src, index, eos), "tgt_in": tgt_in, "tgt_out": tgt_out}


class BatchStream(IterableDataset):
    """Ready-made batches. Iterable so Lightning leaves batching and sharding to us.

    An epoch's batches are a function of the epoch number alone (``plan``), so a run resumed in the
    middle of an epoch replays that epoch's plan and skips the batches it has already trained on:
    the resumed run sees exactly the batches an uninterrupted one would have seen. In DataLoader
    workers, worker ``w`` of ``k`` collates batches ``w, w + k, ...``; the DataLoader takes them
    from its workers in turn, so the order is the same with any number of workers.
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
        self._pass: tuple[int, int] | None = None  # the next pass: (epoch, batches it skips)

    def resume(self, epoch: int, done: int) -> None:
        """The next pass over ``epoch`` starts after its first ``done`` batches."""
        self._skip = (epoch, done)

    def begin(self) -> None:
        """Settle the next pass's epoch and skip, in the process that owns the stream (workers
        get copies of it, so what they change is lost)."""
        epoch = self._epoch_of()
        epoch = self._iterations if epoch is None else epoch
        self._iterations += 1
        skip, self._skip = self._skip, None
        if skip is not None and skip[0] > epoch:  # settled before Lightning counted epochs
            epoch = skip[0]
        self._pass = (epoch, skip[1] if skip is not None and skip[0] == epoch else 0)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if self._pass is None:
            self.begin()
        assert self._pass is not None  # begin() settles it
        (epoch, done), self._pass = self._pass, None
        batches = itertools.islice(self._plan(epoch), done, None)
        worker = get_worker_info()
        if worker is not None and worker.num_workers > 1:
            batches = itertools.islice(batches, worker.id, None, worker.num_workers)
        for indices in batches:
            yield self._collate(indices)

    def __len__(self) -> int:
        return self._count()


class ResumableLoader(DataLoader):
    """A DataLoader Lightning can resume mid-epoch: its checkpointed state is the epoch and how many
    of its batches were trained on (Lightning calls ``state_dict`` when it saves a checkpoint and
    ``load_state_dict`` before it iterates again on resume). With ``workers`` > 0, batches are
    collated in that many worker processes (forked: the encoded corpus's pages are shared), two
    batches ahead each, and pinned when a GPU takes them."""

    dataset: BatchStream

    def __init__(self, stream: BatchStream, done: Callable[[], tuple[int, int]], workers: int = 0):
        fork = "fork" if workers and "fork" in multiprocessing.get_all_start_methods() else None
        super().__init__(stream, batch_size=None, num_workers=workers,
                         pin_memory=torch.cuda.is_available(), multiprocessing_context=fork,
                         prefetch_factor=2 if workers else None)
        self._done = done

    def __iter__(self):  # noqa: ANN204 - DataLoader's own iterator type
        # Workers copy the stream when the iterator is made: its pass is settled before. Without
        # workers it is settled at the first batch, once Lightning has counted its epochs: resuming
        # from a checkpoint of an epoch's last step, Lightning makes the iterator, then counts that
        # epoch done, and iterates it as the next one (settled at once, that epoch was skipped).
        if self.num_workers:
            self.dataset.begin()
        return super().__iter__()

    def state_dict(self) -> dict[str, int]:
        epoch, batches = self._done()
        return {"epoch": epoch, "batches": batches, "per_epoch": len(self.dataset)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume after the batches already trained on. A checkpoint made with another number of
        devices (or micro-batch size) counted its own batches: its position maps by the fraction
        of the epoch done (the same sentences are not guaranteed; the step count is)."""
        batches, before, now = int(state["batches"]), state.get("per_epoch"), len(self.dataset)
        epoch = int(state["epoch"])
        if batches >= (before or now):  # saved at its epoch's last step: Lightning resumes at
            epoch, batches = epoch + 1, 0  # the next epoch (decided before any rescaling)
        elif before and before != now:
            batches = min(now, round(batches * now / before))
        self.dataset.resume(epoch, batches)


def shape_census(batches: Sequence[Sequence[int]], lengths: np.ndarray) -> dict[str, float]:
    """What a plan's ``batches`` (example indices) cost as tensors, from the examples' model-side
    (source, target) ``lengths`` (``Encoded.lengths``): how many batches, how many distinct batch
    shapes (rows, source width, target width) they take (each a compile or a CUDA graph of its
    own, and a graph cuDNN's attention builds), and the share of the tensors' positions, both
    sides, that are padding."""
    sizes = np.asarray(lengths, dtype=np.int64).reshape(-1, 2)
    shapes, computed, real = set(), 0, 0
    for batch in batches:
        rows = sizes[np.asarray(batch, dtype=np.int64)]
        width = rows.max(axis=0)
        shapes.add((len(batch), int(width[0]), int(width[1])))
        computed += len(batch) * int(width.sum())
        real += int(rows.sum())
    return {"batches": len(batches), "shapes": len(shapes),
            "padding_share": round(1 - real / computed, 4) if computed else 0.0}
