"""A Python process with torch, Lightning and the CLI's modules imported once, that forks a child
per CLI call (``helpers.cli``): each ``python -m reproduce`` of a test would spend ~6 s of a core
importing them, and the suite makes about a hundred such calls.

Run as ``python tests/zygote.py``; it reads one request per line on stdin (JSON: argv, env, cwd,
stdout and stderr file paths), forks, answers the child's pid, then its exit code (as
``subprocess`` gives it: minus the signal that ended it). The child leaves the loop and runs the
CLI at the top level of this script, as ``python -m reproduce`` would, and ends as any process
does: SystemExit's code, threads joined, ``atexit`` handlers run, streams flushed.

Imports read some environment variables once (the HF hub's, torch's threads): ``helpers.cli``
forks only where a call's environment differs from this process's in variables read later (the
results and runs folders, W&B's); any other difference, e.g. a ``PYTHONPATH`` that injects a fault,
gets a fresh ``python -m reproduce``."""

import json
import os
import sys
import threading

import pytorch_lightning  # noqa: F401
import torch  # noqa: F401

import reproduce.__main__  # noqa: F401
import reproduce.commands.table  # noqa: F401
import reproduce.tables.render  # noqa: F401
import reproduce.train.runner  # noqa: F401


def serve() -> dict:
    """Fork a child per request; the child returns its request, this process never returns."""
    assert threading.active_count() == 1, "forking a process with threads"
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            return request
        print(pid, flush=True)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)
    raise SystemExit(0)


def become(request: dict) -> None:
    """This child as ``python -m reproduce <argv>`` started in ``cwd`` with ``env``."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, mode in ((0, os.devnull, os.O_RDONLY),
                           (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                           (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(path, mode, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)
    sys.path[0] = os.getcwd()  # as -m sets it, not this script's folder
    sys.argv = [reproduce.__main__.__file__, *request["argv"]]
    del sys.modules["reproduce.__main__"]  # run afresh as __main__, as -m does


if __name__ == "__main__":
    become(serve())
    import runpy

    runpy.run_module("reproduce", run_name="__main__", alter_sys=True)
