"""A Python process with torch, Lightning and the CLI's modules imported once, that forks a child
per CLI call (``helpers.cli``): each ``python -m reproduce`` of a test would spend ~6 s of a core
importing them, and the suite makes about a hundred such calls.

Run as ``python tests/zygote.py``; it reads one request per line on stdin (JSON: argv, env, cwd,
stdout and stderr file paths), forks, answers the child's pid, then its exit code (as
``subprocess`` gives it: minus the signal that ended it). The child leaves the loop and runs the
CLI at the top level of this script, as ``python -m reproduce`` would, and ends as that does
(``reproduce.__main__.run``): its code, threads joined, ``atexit`` handlers run, streams flushed,
no teardown of the modules. Once the child and whatever it started have closed its stdout and
stderr, the zygote answers ``closed``.

Imports read some environment variables once (the HF hub's, torch's threads): ``helpers.cli``
forks only where a call's environment differs from this process's in variables read later (the
results and runs folders, W&B's) or in the ``PYTHONPATH`` of a fault ``helpers.inject`` wrote (the
child runs it before the CLI, as Python runs a ``sitecustomize``; the faults patch attributes of
modules, which works the same after the imports); any other difference gets a fresh
``python -m reproduce``. A request may also ask for a process group of the child's own and for
Ctrl-C to raise KeyboardInterrupt (``helpers.start``)."""

import gc
import json
import os
import selectors
import signal
import sys
import tempfile
import threading

import spawner  # tests/spawner.py: this script's folder is on the path
from task_hand_over import task_key  # tests/task_hand_over/task_key.py

# what the imports print on stderr (warnings) goes to every child's stderr, as a fresh process
# prints it
with tempfile.TemporaryFile() as _said:
    _stderr = os.dup(2)
    os.dup2(_said.fileno(), 2)
    try:
        import pytorch_lightning  # noqa: F401

        # what a CLI imports when it first scores BLEU (Moses' tokenizer): ~0.4 s of a core in
        # each child that scores. Not W&B: importing it makes a temporary folder for its media
        # that the first child to exit would delete under every later one
        import sacremoses  # noqa: F401
        import torch

        import reproduce.__main__
        import reproduce.commands.table  # noqa: F401
        import reproduce.tables.render  # noqa: F401
        import reproduce.train.runner  # noqa: F401
    finally:
        sys.stderr.flush()
        os.dup2(_stderr, 2)
        os.close(_stderr)
    _said.seek(0)
    IMPORT_STDERR = _said.read()

# matplotlib (~1 s), which a fresh CLI imports only when it draws a table's figures: what it says
# here (on a new machine, that it builds its font cache) is not every child's to say
from reproduce.tables.figures import pyplot  # noqa: E402

pyplot()
# the machine's matmul rate, which a CLI measures once for its records' cost (~0.2 s of a core):
# measured here once for every child, by a one-thread zygote only. With more threads the matmul
# would start GNU OpenMP's thread pool, and a child forked after that hangs in its first parallel
# op (tried: 2 threads, one 1024 x 1024 product before the fork)
from reproduce.util.machine import measured_tflops  # noqa: E402

if torch.get_num_threads() == 1:
    measured_tflops()
# What the imports made lives as long as the process: kept out of the collector's reach, a child's
# collections neither walk it nor write to its pages (copying them from this process). A forked
# smoke run of table3 base took 2.88 CPU-s against 3.12 (one thread, an AMD EPYC, 2026-11-29).
gc.freeze()


def serve() -> dict:
    """Fork a child per request; the child returns its request, this process never returns.
    Answers the child's pid, its exit code as soon as it has exited, then ``closed`` once its
    stdout and stderr are closed (by any process it left holding them, too), as
    ``subprocess.run(capture_output=True)`` returns."""
    assert threading.active_count() == 1, "forking a process with threads"
    for line in sys.stdin:
        request = json.loads(line)
        pipes = [os.pipe(), os.pipe()]  # stdout, stderr: (read, write)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            for read, _ in pipes:
                os.close(read)
            request["fds"] = [write for _, write in pipes]
            if request.get("new_session"):  # a process group of its own, made on both sides
                os.setpgid(0, 0)  # (as a shell does) so that it exists once the pid is answered
            return request
        for _, write in pipes:
            os.close(write)
        if request.get("new_session"):
            try:
                os.setpgid(pid, pid)
            except ProcessLookupError:  # it has already ended
                pass
        print(pid, flush=True)
        _drain(pid, [pipes[0][0], pipes[1][0]], [request["stdout"], request["stderr"]])
        print("closed", flush=True)
    raise SystemExit(0)


def _drain(pid: int, fds: list[int], paths: list[str]) -> None:
    """Copy the child's stdout and stderr pipes into their files until every writer has closed
    them, the imports' stderr first; answer the child's exit code when it exits."""
    files = {fd: open(path, "wb") for fd, path in zip(fds, paths, strict=True)}
    files[fds[1]].write(IMPORT_STDERR)
    ended = os.pidfd_open(pid)
    with selectors.DefaultSelector() as selector:
        for fd in [*files, ended]:
            selector.register(fd, selectors.EVENT_READ)
        while len(selector.get_map()) > 0:
            for key, _ in selector.select():
                if key.fd == ended:
                    _, status = os.waitpid(pid, 0)
                    print(os.waitstatus_to_exitcode(status), flush=True)
                    selector.unregister(ended)
                    os.close(ended)
                elif data := os.read(key.fd, 65536):
                    files[key.fd].write(data)
                else:
                    selector.unregister(key.fd)
                    os.close(key.fd)
    for file in files.values():
        file.close()


def become(request: dict) -> None:
    """This child as ``python -m reproduce <argv>`` started in ``cwd`` with ``env``."""
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, opened in ((0, null), (1, request["fds"][0]), (2, request["fds"][1])):
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if request.get("sigint"):  # as a fresh Python started with SIGINT not ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # a CLI that starts CLIs (ranks, workers) forks them from a copy of itself made now
    # (tests/spawner.py); in a process that copy forked, its own request, applied
    spawned = False
    while spawner.wants_spawner(request["argv"], dict(os.environ)):
        if (forked := spawner.start()) is None:
            break
        spawner.apply(request := forked)
        spawned = True
    if spawned:
        spawner.set_threads()
    sys.path[0] = os.getcwd()  # as -m sets it, not this script's folder
    sys.argv = [reproduce.__main__.__file__, *request["argv"]]
    del sys.modules["reproduce.__main__"]  # run afresh as __main__, as -m does
    task_key.run_injected()  # helpers.inject's sitecustomize


if __name__ == "__main__":
    become(serve())
    import runpy

    runpy.run_module("reproduce", run_name="__main__", alter_sys=True)
