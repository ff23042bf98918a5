"""What one steady training step asks of the host, counted for the record (``step_census``).

One optimizer step (all its micro-batches, the optimizer's update included) is profiled with
``torch.profiler``: the ``STEP``-th of the fit (or its last, if shorter), which from a start at
step 0 (or a resume at a save's round number) is neither a logging step (``LOG_EVERY``) nor, at
the scales' step-based saves, a save. Counted:

* ``ops``: the aten ops the host dispatched at the top level (those inside another aten op are
  its implementation); compiled graphs dispatch only what they call outside their own kernels.
* ``kernels``: on a GPU the kernels launched (CUDA's own events); on a CPU the aten ops that
  call no other, views and allocations left out (each of the rest runs as a kernel).
* ``host_waits``: ops whose answer the host must have: on a CPU the aten ops of
  ``host_waits._READS`` (a value read, a size that depends on values) that the host asked for;
  on a GPU CUDA's synchronizing calls (stream, device and event synchronize, copies).

And where its time went (``costs``): the host's span, the device's busy time on a GPU, and the
costliest kernels (GPU) or ops (CPU). A profiled step runs a little slower (the host's span most);
it is one of the run's steps. Where the profiler cannot
start (another profiler running), the record says so instead."""

from __future__ import annotations

import logging
import os
from typing import Any

import pytorch_lightning as pl
import torch
from torch.profiler import ProfilerActivity, profile

from reproduce.errors import one_line
from reproduce.train.callbacks import LOG_EVERY
from reproduce.train.host_waits import _INDEXING, _READS

STEP = 12  # not a logging step (every LOG_EVERY-th), nor a multiple of the saves' 5, 100, ...
assert (STEP + 1) % LOG_EVERY and STEP % 5 and (STEP + 1) % 5
READS = {f"aten::{op.__name__.split('.')[-1]}" for op in _READS}
# where a read inside another op is still the host's: indexing with a mask, and item()
ASKING = {f"aten::{op.__name__.split('.')[-1]}" for op in _INDEXING} | {
    "aten::item", "aten::repeat_interleave"}
# ops that launch no kernel (views, metadata, allocation): not counted as kernels on a CPU
NO_KERNEL = {"aten::as_strided", "aten::view", "aten::_reshape_alias", "aten::detach",
             "aten::resolve_conj", "aten::resolve_neg", "aten::empty", "aten::empty_strided",
             "aten::t", "aten::transpose", "aten::expand", "aten::unsqueeze", "aten::squeeze",
             "aten::slice", "aten::select", "aten::permute", "aten::alias", "aten::reshape",
             "aten::split", "aten::narrow", "aten::unbind", "aten::_unsafe_view",
             "aten::split_with_sizes", "aten::lift_fresh", "aten::contiguous"}
# CUDA runtime calls after which the host has waited for the device: synchronizations and the
# synchronous copies; an asynchronous copy (a pinned batch going up) is no wait, and a value read
# back is its cudaMemcpyAsync and the cudaStreamSynchronize after it, counted once
CUDA_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cudaMemcpy")


def is_cuda_wait(name: str) -> bool:
    """Whether a CUDA runtime call's profiler name is a wait of the host (``CUDA_WAITS``)."""
    return name.startswith(CUDA_WAITS) and "Async" not in name


def census(roots, events=None) -> dict[str, int]:
    """``ops``, ``kernels`` and ``host_waits`` of a profile, from the profiler's own tree of the
    ops it recorded (``kineto_results.experimental_event_tree()``: each op with the ops it called,
    about 1/20 of the time ``profile.events()`` takes to build its event list). On a CPU a read
    counts where the host asked for it (at the top level, or inside ``item()`` or a boolean mask's
    indexing), not inside another op's own implementation (a CPU's fused Adam reads its step
    counts; on a GPU they stay there). On a GPU, ``events`` (``profile.events()``) gives the
    kernels and CUDA's waits."""
    ops = kernels = waits = 0
    stack: list[tuple[Any, frozenset[str]]] = [(root, frozenset()) for root in roots]
    while stack:
        node, ancestors = stack.pop()  # ancestors: the names of the aten ops above it
        name = node.name
        if name.startswith("aten::"):
            ops += not ancestors
            kernels += (name not in NO_KERNEL
                        and not any(c.name.startswith("aten::") for c in node.children))
            waits += name in READS and ancestors <= ASKING and not READS & ancestors
            ancestors = ancestors | {name}
        stack.extend((child, ancestors) for child in node.children)
    if events is not None:
        kernels = sum(e.device_type == torch.autograd.DeviceType.CUDA for e in events)
        waits = sum(is_cuda_wait(e.name) for e in events)
    return {"ops": ops, "kernels": kernels, "host_waits": waits}


TOP = 8  # the costliest kernels or ops a census names
log = logging.getLogger("reproduce")


def costs(roots, events=None, top: int = TOP) -> dict[str, Any]:
    """Where a profiled step's time went: ``host_ms``, the span of the ops the host dispatched
    (the first one's start to the last one's end); on a GPU ``device_ms``, its kernels' time
    summed (the device's busy time: well under ``host_ms``, the host is what bounds the step);
    ``top``, the ``top`` costliest as ``[name, ms, calls]``: on a GPU its kernels by their time,
    on a CPU the aten ops by their own time (outside the ops they called)."""
    spent: dict[str, list[float]] = {}  # name -> [ms, calls]

    def add(name: str, ms: float) -> None:
        entry = spent.setdefault(name, [0.0, 0])
        entry[0], entry[1] = entry[0] + ms, entry[1] + 1

    if events is None:  # a CPU: each aten op's own time, from the tree
        stack = list(roots)
        while stack:
            node = stack.pop()
            stack.extend(node.children)
            if node.name.startswith("aten::"):
                add(node.name, (node.duration_time_ns
                                - sum(c.duration_time_ns for c in node.children)) / 1e6)
    else:  # a GPU: its kernels' time
        for e in events:
            if e.device_type == torch.autograd.DeviceType.CUDA:
                add(e.name[:80], e.time_range.elapsed_us() / 1e3)
    span = (max((r.end_time_ns for r in roots), default=0)
            - min((r.start_time_ns for r in roots), default=0))
    ranked = sorted(spent.items(), key=lambda kv: -kv[1][0])[:top]
    return {"host_ms": round(span / 1e6, 3),
            "device_ms": None if events is None else round(sum(ms for ms, _ in spent.values()), 3),
            "top": [[name, round(ms, 3), int(calls)] for name, (ms, calls) in ranked]}


def said(result: dict[str, Any]) -> str:
    """A census in one line: where the profiled step went, its three costliest."""
    busy = result.get("device_ms")
    return (f"profiled step {result['step']}: host {result['host_ms']:.1f} ms"
            + (f", GPU busy {busy:.1f} ms" if busy is not None else "")
            + f", {result['kernels']} kernels, {result['host_waits']} host waits; costliest: "
            + ", ".join(f"{name} {ms:.1f} ms" for name, ms, _ in result["top"][:3]))


class StepCensus(pl.Callback):
    """Profiles the ``after``-th optimizer step of this fit (a resumed run's counted from where
    it resumed), or the run's last where fewer are left: ``result`` holds its census, or why
    there is none."""

    def __init__(self, steps: int, after: int = STEP) -> None:
        self.steps, self.after, self.step = steps, after, -1
        self.result: dict[str, Any] = {}
        self._profile: profile | None = None
        self._cuda = False

    def on_train_start(self, trainer, pl_module) -> None:
        start = trainer.global_step
        self.step = min(start + self.after, self.steps - 1) if start < self.steps else -1

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step != self.step or self._profile is not None or self.result:
            return
        self._cuda = pl_module.device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self._cuda else [])
        # Kineto prints "profiler_start" / "profiler_stop" (its USDT level, 5) to stderr at every
        # profile: 6, past its last level, keeps them out of the user's terminal. Kineto reads it
        # when it first starts, in this process; a KINETO_LOG_LEVEL of the user's own is kept.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        try:
            self._profile = profile(activities=activities)
            self._profile.__enter__()
        except Exception as e:  # noqa: BLE001 - a census is never worth a run
            self._profile = None
            self.result = {"step": self.step, "failed": one_line(e)}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._profile is None or trainer.global_step == self.step:
            return  # not profiling, or the step's next micro-batch comes
        self._stop()

    def on_train_end(self, trainer, pl_module) -> None:
        self._stop()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._profile is None:
            return
        running, self._profile = self._profile, None
        try:
            if self._cuda:
                torch.cuda.synchronize()
            running.__exit__(None, None, None)
            assert running.profiler is not None and running.profiler.kineto_results is not None
            tree = running.profiler.kineto_results.experimental_event_tree()
            events = running.events() if self._cuda else None
            self.result = {"step": self.step, "device": "cuda" if self._cuda else "cpu",
                           **census(tree, events), **costs(tree, events)}
            log.info("%s", said(self.result))  # in the log too: a run stopped early has no record
        except Exception as e:  # noqa: BLE001
            self.result = {"step": self.step, "failed": one_line(e)}
