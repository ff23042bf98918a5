"""The token ids of an encoded corpus read from their ``.npy`` file with ``pread``, not mapped.

A batch gathers sentences from all over the corpus. Through a memory map each of them faults in
its page and the kernel maps the neighbouring pages too (read-around, fault-around, large folios),
so a run's resident memory climbs toward the token file's size (``results/first-run-mapped.md``
against ``results/first-run-9m-mapped.md``). Every rank and every DataLoader worker counts those
pages again, and a scheduler that polices RSS (SLURM's ``jobacct_gather/linux``) sees a job grow
with its corpus. Read with ``pread`` the pages still come from (and stay in) the kernel's page cache,
shared by every process, but none of them is mapped: a process holds only the batch it reads.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


class TokenFile:
    """A 1-D array in an ``.npy`` file, read a sequence at a time: ``gather(starts, lengths)``."""

    _fd: int | None = None  # opened on the first read, in each process
    _pid = 0

    def __init__(self, path: Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(f)
            self.offset = f.tell()
        if len(shape) != 1:
            raise ValueError(f"{self.path}: {len(shape)}-D, not a 1-D array of token ids")
        self.dtype = np.dtype(dtype)
        self.length = int(shape[0])
        size = self.path.stat().st_size
        if size != self.offset + self.length * self.dtype.itemsize:
            raise ValueError(f"{self.path}: {size} bytes, not the {self.offset} + "
                             f"{self.length} x {self.dtype.itemsize} its header states")

    def __len__(self) -> int:
        return self.length

    def __getstate__(self) -> dict:  # a DataLoader worker started by spawn opens its own
        return {**self.__dict__, "_fd": None, "_pid": 0}

    def __del__(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)

    def _descriptor(self) -> int:
        if self._fd is None or self._pid != os.getpid():  # a forked worker opens its own
            self._fd, self._pid = os.open(self.path, os.O_RDONLY), os.getpid()
        return self._fd

    def gather(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The ids ``[start, start + length)`` of each sequence, back to back, as one array.
        Sequences that follow each other in the file are read in one call."""
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        out = np.empty(int(lengths.sum()), dtype=self.dtype)
        if not len(out):
            return out
        ends = starts + lengths
        if starts.min() < 0 or ends.max() > self.length:
            raise IndexError(f"{self.path}: a sequence outside [0, {self.length})")
        first = np.ones(len(starts), dtype=bool)  # a read begins here: not where the last ended
        first[1:] = starts[1:] != ends[:-1]
        last = np.append(np.flatnonzero(first)[1:] - 1, len(starts) - 1)
        view = out.data.cast("B")
        size = self.dtype.itemsize
        fd = self._descriptor()
        at = 0
        for begin, end in zip(starts[first].tolist(), ends[last].tolist(), strict=True):
            stop = at + (end - begin) * size
            where = self.offset + begin * size
            while at < stop:  # a long read may come back in parts
                got = os.preadv(fd, [view[at:stop]], where)
                if got <= 0:
                    raise OSError(f"{self.path}: ends at byte {where}, inside a sequence")
                at, where = at + got, where + got
        return out
