"""How this project's processes end: ``end(main)`` runs ``main`` and ends the process with its code
as Python ends one, less the teardown of every module it imported. The CLI (``reproduce.__main__``),
its ranks and workers, and each SLURM task (``reproduce.launch.task_process``) end this way."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn


def end(main: Callable[[], object]) -> NoReturn:
    """``main()``, then threads joined, ``atexit`` handlers run (W&B's, logging's,
    multiprocessing's, temporary folders'), stdout and stderr flushed, then ``os._exit`` with
    ``main``'s code (an int, None for 0, or a ``SystemExit``'s). Tearing down torch and Lightning
    module by module took a core 1.2 s at every exit of a process that imported them (CPU seconds
    of a fresh one: 4.03 in all against 2.87 at its script's last line; of a CLI forked after the
    imports, as the tests run it, stopping at a config error: 1.33 against 0.08; a 2-core AMD EPYC,
    2026-11-29). Every file the code writes is closed where it is written. An exception that
    escapes ``main`` ends the process as Python does. Under a profiler or a debugger
    (``python -m cProfile -o F -m reproduce``, as ``benchmarks/paper_run.py --profile`` runs it;
    pdb, trace) the process ends as Python ends it, so the tool's work after ``main`` (cProfile
    writes ``F`` then) is done."""
    try:
        code = exit_code(main())
    except SystemExit as e:  # argparse's errors, --help and --version; a task requeued
        code = exit_code(e.code)
    if sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(code)
    threading._shutdown()  # type: ignore[attr-defined]  # what Python's own exit does first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is None or stream.closed:  # as Python: nothing to flush
            continue
        try:
            stream.flush()
        except OSError:  # a closed pipe: Python exits with 120 then
            code = 120
    _flush_c_stdio()
    os._exit(code)


def _flush_c_stdio() -> None:
    """What C's ``exit()`` flushes and ``os._exit`` does not: the C stdio buffers of native code
    (a library's ``printf`` into a stdout that is a file, such as a SLURM task's log)."""
    import ctypes

    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):  # no C library to ask
        pass


def exit_code(code: object) -> int:
    """The status Python exits with for ``SystemExit(code)``, printing a message code as it does."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1
