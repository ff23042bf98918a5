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
    _check_rank(rank, world_size)
    sizes = np.asarray(lengths, dtype=np.int64).reshape(-1, 2)
    if len(sizes) == 0:
        return []
    cost = sizes.max(axis=1)
    rng = np.random.default_rng(seed)
    order = _by_length(sizes, cost, shuffle, rng)
    bounds = _batch_bounds(cost[order], batch_tokens)
    batches = [order[start:end].tolist() for start, end in itertools.pairwise(bounds)]
    return _deal(batches, rank, world_size, rng if shuffle else None)


class ShapedBatch(list[int]):
    """A batch's example indices and the (source, target) widths its tensors are padded to: a
    shape of a fixed set (``Shapes``), whatever the batch's own longest pairs."""

    def __init__(self, indices: Sequence[int], widths: tuple[int, int]):
        super().__init__(indices)
        self.widths = widths


@dataclass(frozen=True)
class Shapes:
    """A fixed set of batch shapes an epoch's batches all take (``train.batch_shapes``): a batch
    of shape ``b`` holds ``rows[b]`` pairs whose key (``key``) is at most ``keys[b]``, padded to
    ``src[b]`` x ``tgt[b]``. Fitted once to a corpus's lengths, so every epoch and every rank
    takes the same few shapes, where exact widths make a new one almost every step: what a static
    compiled graph, a CUDA graph or cuDNN's attention (a graph per shape) needs. The shapes hold
    the lengths they were fitted to (``batch_by_shapes`` refuses others)."""

    keys: np.ndarray  # (n,) ascending
    src: np.ndarray  # (n,) the longest source among pairs of key <= keys[b]
    tgt: np.ndarray  # (n,) likewise the longest target
    rows: np.ndarray  # (n,) batch_tokens // the wider side, at least 1
    ratio: float  # the corpus's target tokens over its source tokens

    @classmethod
    def fit(cls, lengths: Sequence[tuple[int, int]] | np.ndarray, count: int,
            batch_tokens: int) -> Shapes:
        """At most ``count`` shapes for pairs of (source, target) ``lengths``: the keys that pad
        the pairs least, each pair's key rounded up to its shape's."""
        if count < 1 or batch_tokens < 1:
            raise ValueError(f"count and batch_tokens must be positive, got {count} and "
                             f"{batch_tokens}")
        sizes = np.asarray(lengths, dtype=np.int64).reshape(-1, 2)
        if len(sizes) == 0:
            raise ValueError("no lengths to fit shapes to")
        ratio = float(sizes[:, 1].sum() / sizes[:, 0].sum())
        key = cls.key(sizes, ratio)
        keys = _least_padding_widths(key, count)
        shape = np.searchsorted(keys, key)  # the first shape each pair fits
        widest = np.zeros((len(keys), 2), dtype=np.int64)
        np.maximum.at(widest, shape, sizes)
        src, tgt = np.maximum.accumulate(widest, axis=0).T  # a shape takes the pairs before it
        return cls(keys, src, tgt, np.maximum(1, batch_tokens // np.maximum(src, tgt)), ratio)

    @staticmethod
    def key(sizes: np.ndarray, ratio: float) -> np.ndarray:
        """A pair's key: its source length or its target length over the corpus's target-to-
        source ratio, whichever is larger. Shapes then follow the corpus's two sides (a target
        side shorter than its source, as German's at 37000 pieces, is padded as much as the
        source side, not to the source's width)."""
        return np.maximum(sizes[:, 0], np.ceil(sizes[:, 1] / ratio - 1e-9).astype(np.int64))

    def __len__(self) -> int:
        return len(self.keys)


def _least_padding_widths(cost: np.ndarray, count: int) -> np.ndarray:
    """At most ``count`` widths, the largest ``cost.max()``, that pad least when each cost is
    rounded up to the next width: a dynamic programme over the distinct costs (O(count x
    distinct costs^2), a few milliseconds at 256 tokens a pair)."""
    values, counts = np.unique(cost, return_counts=True)
    if len(values) <= count:
        return values
    m = len(values)
    below = np.concatenate([[0], np.cumsum(counts)])  # below[j]: pairs of the first j values
    mass = np.concatenate([[0], np.cumsum(counts * values)])
    # gap[i, j]: the padding of the pairs of values (i, j] rounded up to values[j]
    gap = (values[None, :] * (below[None, 1:] - below[1:, None])
           - (mass[None, 1:] - mass[1:, None]))
    earlier = np.arange(m)[:, None] < np.arange(m)[None, :]
    best = values * below[1:] - mass[1:]  # one width, values[j], over values[:j + 1]
    came = []  # per added width: the width before j where adding one paid, else -1
    for _ in range(count - 1):
        total = np.where(earlier, best[:, None] + gap, np.iinfo(np.int64).max)
        step = total.min(axis=0)
        came.append(np.where(step < best, total.argmin(axis=0), -1))
        best = np.minimum(best, step)
    widths, j = [m - 1], m - 1
    for back in reversed(came):
        if back[j] >= 0:
            j = int(back[j])
            widths.append(j)
    return values[sorted(widths)]


def batch_by_shapes(
    lengths: Sequence[tuple[int, int]] | np.ndarray,
    shapes: Shapes,
    shuffle: bool,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
) -> list[list[int]]:
    """``batch_by_tokens``'s batches in ``shapes`` only. Pairs sorted by their key
    (``Shapes.key``) fill batches of the first shape it fits, ``shapes.rows`` pairs each; the
    pairs one shape leaves over join the next one's (they fit it), and the last batch, if short,
    is filled up with other pairs drawn from the epoch's seed (fewer than its rows seen twice,
    each at most twice, unless the corpus is smaller than a batch). Each batch is a
    ``ShapedBatch``, its tensors as wide as its shape. Shuffling and dealing to ranks are
    ``batch_by_tokens``'s."""
    _check_rank(rank, world_size)
    sizes = np.asarray(lengths, dtype=np.int64).reshape(-1, 2)
    if len(sizes) == 0:
        return []
    key = Shapes.key(sizes, shapes.ratio)
    first = np.minimum(np.searchsorted(shapes.keys, key), len(shapes) - 1)
    misfits = np.flatnonzero((key > shapes.keys[first]) | (sizes[:, 0] > shapes.src[first])
                             | (sizes[:, 1] > shapes.tgt[first]))
    if len(misfits):
        raise ValueError(f"a pair of {sizes[misfits[0]].tolist()} tokens fits none of the shapes"
                         f" (fitted to other lengths; the widest: {int(shapes.src[-1])} x "
                         f"{int(shapes.tgt[-1])})")
    rng = np.random.default_rng(seed)
    order = _by_length(sizes, key, shuffle, rng)
    ends = np.searchsorted(key[order], shapes.keys, side="right")  # past each shape's pairs
    batches: list[list[int]] = []
    start, rows, widths = 0, 1, (0, 0)
    for b, end in enumerate(ends):
        rows, widths = int(shapes.rows[b]), (int(shapes.src[b]), int(shapes.tgt[b]))
        while end - start >= rows:
            batches.append(ShapedBatch(order[start:start + rows].tolist(), widths))
            start += rows
    if start < len(order):  # the widest shape's last batch, filled up with pairs drawn
        left, others = order[start:], order[:start]
        need = rows - len(left)
        fill = (rng.choice(others, need, replace=False) if need <= len(others)
                else np.resize(order, need))  # a corpus smaller than a batch: all, repeated
        batches.append(ShapedBatch(np.concatenate([left, fill]).tolist(), widths))
    return _deal(batches, rank, world_size, rng if shuffle else None)


def _check_rank(rank: int, world_size: int) -> None:
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")


def _by_length(sizes: np.ndarray, key: np.ndarray, shuffle: bool,
               rng: np.random.Generator) -> np.ndarray:
    """Pair indices sorted by ``key``, then by source length (which keeps both sides similar
    within a batch), then by a draw from ``rng`` with ``shuffle`` (else by index)."""
    tiebreak = rng.permutation(len(sizes)) if shuffle else np.arange(len(sizes))
    return np.lexsort((tiebreak, sizes[:, 0], key))


def _deal(batches: list[list[int]], rank: int, world_size: int,
          rng: np.random.Generator | None) -> list[list[int]]:
    """This rank's share of an epoch's batches, in an order drawn from ``rng`` (None: as they
    are), dealt round-robin, the last round filled up with the epoch's first batches."""
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    if world_size > 1:
        batches = batches + [batches[i % len(batches)]
                             for i in range(-len(batches) % world_size)]
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


def source_tensor(src: Packed, index: np.ndarray, eos: int, width: int = 0) -> torch.Tensor:
    """Padded source sequences: pieces + EOS, ``width`` wide (0: as the longest)."""
    lengths = src.lengths[index]
    out = src.rows(index, width or int(lengths.max()) + 1, offset=0)
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
        """Padded ``src`` (pieces + EOS), ``tgt_in`` (BOS + pieces), ``tgt_out`` (pieces + EOS):
        as wide as the longest, or a ``ShapedBatch``'s widths."""
        index = np.asarray(indices, dtype=np.int64)
        rows = torch.arange(len(index))
        tgt_lengths = self.tgt.lengths[index]
        src_width, width = getattr(indices, "widths", (0, int(tgt_lengths.max()) + 1))
        tgt_in = self.tgt.rows(index, width, offset=1)
        tgt_in[:, 0] = bos
        tgt_out = torch.zeros_like(tgt_in)  # the same pieces one column left: read once
        tgt_out[:, :-1] = tgt_in[:, 1:]
        tgt_out[rows, torch.from_numpy(tgt_lengths)] = eos
        return {"src": source_tensor(self.src, index, eos, src_width), "tgt_in": tgt_in,
                "tgt_out": tgt_out}


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
    sides, that are padding. A ``ShapedBatch`` counts at its shape's widths."""
    sizes = np.asarray(lengths, dtype=np.int64).reshape(-1, 2)
    shapes, computed, real = set(), 0, 0
    for batch in batches:
        rows = sizes[np.asarray(batch, dtype=np.int64)]
        width = np.asarray(getattr(batch, "widths", rows.max(axis=0)))
        shapes.add((len(batch), int(width[0]), int(width[1])))
        computed += len(batch) * int(width.sum())
        real += int(rows.sum())
    return {"batches": len(batches), "shapes": len(shapes),
            "padding_share": round(1 - real / computed, 4) if computed else 0.0}
