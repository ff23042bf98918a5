"""Stop signals, in one module: every handler of SIGTERM, SIGINT, USR2 and SIGALRM is installed
here, and Lightning's flag that ends a fit at a step's end is read and set only here.

Who stops how:

* a run fitting (``callbacks.SaveOnStop``): SIGTERM (a preemption, ``kill``, ``scancel``), USR2
  (SLURM's warning before the time limit) and SIGINT (Ctrl-C) are noted by ``take``'s handler;
  the ranks agree at a step's end, ``stop_at_step_end`` asks Lightning to leave there, and the
  step is saved. ``CtrlC``: a second Ctrl-C stops at once.
* a run on several devices (``devices``): the process that started the ranks forwards SIGTERM and
  SIGINT to their process group (``handling``); a second Ctrl-C kills them now (``CtrlC``).
* a SLURM array task (``launch/task.py``): USR2 outside fitting requeues the job at once
  (``for_the_process``).
* ``--workers`` (``launch/workers.py``): a Ctrl-C reaches the workers from the terminal; the
  parent sends each SIGTERM (a process, not a handler) and waits through more Ctrl-Cs.
* a capped benchmark part (``bench/gpu.py``): SIGALRM (``alarm``).

Lightning's own handlers are set up as a fit starts and restored, with whatever replaced them,
when it ends; its requeue on USR1 is off (``devices.cluster_plugins``).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Handler = Callable[[int, Any], None]
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT)


def in_main_thread() -> bool:
    """Python takes signals in the main thread only: elsewhere no handler can be installed."""
    return threading.current_thread() is threading.main_thread()


def take(handler: Handler, signals: tuple[int, ...]) -> dict[int, Any]:
    """``handler`` for each of ``signals`` from now on, in the main thread; a signal ignored
    (SIGINT in a script's background job) stays ignored. The handlers it replaced."""
    if not in_main_thread():
        return {}
    return {s: signal.signal(s, handler) for s in signals
            if signal.getsignal(s) is not signal.SIG_IGN}


def restore(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


@contextmanager
def handling(handler: Handler, signals: tuple[int, ...]) -> Iterator[None]:
    """``take`` while the block runs, the previous handlers back after it."""
    previous = take(handler, signals)
    try:
        yield
    finally:
        restore(previous)


def for_the_process(signum: int, handler: Handler) -> None:
    """``handler`` for ``signum`` for the rest of this process (a SLURM task's USR2)."""
    signal.signal(signum, handler)


def ignore_ctrl_c() -> None:
    """Ctrl-C ignored from now on (during a save of seconds, which a KeyboardInterrupt would
    leave half done; Lightning restores its handlers when the fit ends)."""
    if in_main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


class CtrlC:
    """Ctrl-Cs counted: the first asks for a stop at a step's end, saved there; the second stops
    at once (``again``)."""

    def __init__(self) -> None:
        self.count = 0

    def again(self) -> bool:
        """Count one Ctrl-C; whether it is the second or later."""
        self.count += 1
        return self.count > 1


def stop_requested(trainer) -> bool:
    """Whether Lightning's flag says the fit ends at this step's end (its SIGTERM handler set it
    before ours took over, or ``stop_at_step_end`` did)."""
    return bool(trainer.received_sigterm)


def stop_at_step_end(trainer, stop: bool = True) -> None:
    """Set Lightning's flag (it has no public setter): with ``stop``, every rank raises its
    ``SIGTERMException`` at this step's end; without, a SIGTERM it took before training is
    forgotten (ours has noted it)."""
    trainer._signal_connector.received_sigterm = stop


def interrupted_by_ctrl_c(exit: SystemExit) -> bool:
    """Whether ``exit`` is Lightning's ``exit(1)`` after a KeyboardInterrupt (its
    ``_call_and_handle_interrupt`` exits inside ``except KeyboardInterrupt``), not another exit
    (the USR2 requeue's, a Stopped)."""
    return isinstance(exit.__context__, KeyboardInterrupt)


@contextmanager
def alarm(seconds: float, raised: Callable[[], BaseException]) -> Iterator[None]:
    """Raise ``raised()`` in this (the main) thread once ``seconds`` have gone (more than 0: a
    timer of 0 s is none, ``setitimer``'s way to turn it off)."""
    if seconds <= 0:
        raise ValueError(f"alarm after {seconds} s: must be more than 0")

    def cut(signum, frame) -> None:
        raise raised()

    before = signal.signal(signal.SIGALRM, cut)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
