"""Where a training step makes the host wait for its device, counted on any device, a CPU too.

On a GPU the host queues kernels and runs ahead; an op whose answer the host needs (a tensor's
value read as a Python number, a boolean mask's selection, whose size the host must know to
allocate) makes it wait until every queued kernel has run, and the GPU then idles while the host
queues the next. ``HostWaits`` counts such ops as they are dispatched, with the step and the line
of our code or Lightning's that asked: on a CPU, where nothing waits, the same code asks the same
questions, so a test can count them (``tests/train/test_fast_step.py``); on a GPU
``torch.cuda.set_sync_debug_mode`` reports the real waits. What it cannot see on a CPU: a Python
number copied to the device (``torch.tensor(x, device=...)``, which a GPU's host may wait on),
``.to("cpu")`` and ``copy_`` to the host (no op where the tensor is already there), and waits
inside kernels; the counted Tensor methods are counted from any thread, the ops from the thread
that entered the mode."""

from __future__ import annotations

import sys
import traceback
from types import FrameType
from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# Ops whose result the host must read: a value (item, int(), float(), bool()), a size that
# depends on values (nonzero and what builds on it), or a comparison answered on the host.
_READS = {aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten.unique_consecutive,
          aten._unique2, aten.unique_dim, aten.equal, aten.is_nonzero}
# Indexing with a boolean mask selects by nonzero inside the kernel
_INDEXING = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}
# Tensor methods that hand a tensor's values to Python without an op a mode would see on a CPU
_METHODS = ("tolist", "numpy", "cpu")


def _boolean_index(args: tuple) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())


def _loader() -> bool:
    """Whether torch's DataLoader itself is asking (on the host, whatever the device)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if "/torch/utils/data/" in frame.f_code.co_filename:
            return True
        if "/reproduce/" in frame.f_code.co_filename:
            return False
        frame = frame.f_back
    return False


def _asker() -> str:
    """The innermost line of the project's or Lightning's code on the stack: who asked."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if frame.filename == __file__:
            continue
        if "/reproduce/" in frame.filename or "/pytorch_lightning/" in frame.filename:
            return f"{frame.filename.rsplit('/', 2)[-2]}/{frame.filename.rsplit('/', 1)[-1]}:" \
                   f"{frame.lineno} {frame.name}"
    return "?"


class HostWaits(TorchDispatchMode):
    """Counts the ops that make the host wait (``waits``: step, what, who asked), while active.
    ``step`` is set by whoever knows it (``CountHostWaits``)."""

    def __init__(self) -> None:
        super().__init__()
        self.step: int | None = None
        self.waits: list[tuple[int | None, str, str]] = []
        self._saved: dict[str, Any] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket
        if _loader():
            pass  # the DataLoader's own seed, drawn from the host's generator as it starts
        elif packet in _READS or (packet in _INDEXING and _boolean_index(args)) or (
                packet is aten.repeat_interleave and not (kwargs or {}).get("output_size")
                and isinstance(args[0], torch.Tensor) and len(args) == 1):
            self.waits.append((self.step, str(packet), _asker()))
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        for name in _METHODS:
            self._saved[name] = original = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._counted(name, original))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved.clear()
        return super().__exit__(*exc)

    def _counted(self, name: str, original):
        def method(tensor, *args, **kwargs):
            self.waits.append((self.step, f"Tensor.{name}", _asker()))
            return original(tensor, *args, **kwargs)
        return method


class CountHostWaits(pl.Callback):
    """``HostWaits`` over a run's training batches, each wait told by the optimizer step it
    came in (``global_step`` as the batch starts: a step's end, its logging, saves and dev
    evaluation count to it)."""

    def __init__(self) -> None:
        self.mode = HostWaits()
        self._on = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.mode.step = trainer.global_step
        if not self._on:
            self.mode.__enter__()
            self._on = True

    def on_train_end(self, trainer, pl_module) -> None:
        self.close()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.close()

    def close(self) -> None:
        if self._on:
            self.mode.__exit__(*sys.exc_info())
            self._on = False
