"""How contenders are timed: interleaved rounds after a warm-up, medians, one result per contender."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

K = TypeVar("K", bound=Hashable)  # what names a contender


def interleaved(contenders: dict[K, Callable[[], float | None]], rounds: int,
                warmup: int = 1) -> dict[K, list[float]]:
    """Seconds per round of each contender. A contender returns None (its wall time is used) or
    the seconds it measured itself. Round r starts at contender r (mod count): the order rotates."""
    names = list(contenders)
    for _ in range(warmup):
        for name in names:
            contenders[name]()
    times: dict[K, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            own = contenders[name]()
            times[name].append(own if own is not None else time.perf_counter() - start)
    return times


@contextlib.contextmanager
def precision_context(precision: str):
    if precision == "bf16-mixed":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yield
    else:
        yield


@dataclass
class Result:
    name: str
    params: int
    seconds: list[float]
    work: float  # per round: target tokens (training) or sentences (decoding)
    flops: float = 0.0  # per round, training only
    precision: str = ""  # training only: 32-true or bf16-mixed
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.work / statistics.median(self.seconds)
