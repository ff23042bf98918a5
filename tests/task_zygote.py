"""A zygote for SLURM tasks: ``python tests/task_zygote.py FOLDER PID``, started by the SLURM tests
with the environment they submit with. It imports what ``tests/zygote.py`` imports (torch,
Lightning, the CLI's modules) and what a task adds (submitit, ``launch.task``), then listens on
``FOLDER/<key>.sock``, its environment's key (``tests/task_hand_over/task_key.py``), and
forks a process for each task that connects: that process is the task, as
``python -u -m reproduce.launch.task_process`` would have run it, with the task's streams, folder,
environment and arguments, and dies with the task's stand-in. Many at once (an array, the ranks of
a run over both nodes); the stand-in gets each one's exit code."""

import ctypes
import gc
import importlib.util
import io
import os
import runpy
import selectors
import signal
import socket
import sys
import tempfile
import threading

import spawner  # tests/spawner.py: this script's folder is on the path
import submitit.core.submission  # noqa: F401
import task_key  # tests/task_hand_over/, on the PYTHONPATH tasks are submitted with
import zygote  # tests/zygote.py: its imports, once

import reproduce.launch.task  # noqa: F401

gc.freeze()

LATER = spawner.READ_LATER + task_key.TASK_LATER


def serve(folder: str, parent: int) -> dict:
    """Accept stand-ins, fork a task for each; return only in a forked task (its request). Dies
    with ``parent``, the test process that started it (``PID``)."""
    ctypes.CDLL(None, use_errno=True).prctl(spawner.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the line above took effect
        raise SystemExit(1)
    own = task_key.key(dict(os.environ), LATER)
    path = os.path.join(folder, own + ".sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.exists(path):
        os.unlink(path)
    listener.bind(path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    tasks: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> pid, its stand-in's connection
    while True:
        for event, _ in selector.select():
            if event.fileobj is listener:
                conn, _ = listener.accept()
                got = spawner._receive(conn)
                if got is None:
                    conn.close()
                    continue
                request, fds = got
                if task_key.key(request["env"], LATER) != own:
                    theirs, mine = request["env"], os.environ
                    print("declined: its environment differs in", sorted(
                        k for k in theirs.keys() | mine.keys()
                        if theirs.get(k) != mine.get(k) and not k.startswith(LATER)), flush=True)
                    spawner._send(conn, {"pid": None})
                    conn.close()
                    for fd in fds:
                        os.close(fd)
                    continue
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    for pidfd, (_, other) in tasks.items():
                        os.close(pidfd)
                        other.close()
                    conn.close()
                    request["fds"] = fds
                    return request
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                tasks[pidfd] = (pid, conn)
                selector.register(pidfd, selectors.EVENT_READ)
                spawner._send(conn, {"pid": pid})
                print(f"forked {pid} for stand-in {request['stand_in']}: {request['argv']}",
                      flush=True)
            else:
                pid, conn = tasks.pop(event.fd)
                selector.unregister(event.fd)
                os.close(event.fd)
                _, status = os.waitpid(pid, 0)
                print(f"{pid} exited {os.waitstatus_to_exitcode(status)}", flush=True)
                try:
                    spawner._send(conn, {"code": os.waitstatus_to_exitcode(status)})
                except OSError:  # the stand-in is gone (killed): nobody to tell
                    pass
                conn.close()


def become(request: dict) -> None:
    """This process as ``python -u -m reproduce.launch.task_process <argv>`` would start: the
    stand-in's streams (unbuffered, as ``-u``), folder and environment, signals as a fresh
    Python's, the imports' warnings on stderr; killed when the stand-in dies."""
    for fd, opened in zip((0, 1, 2), request["fds"], strict=True):
        os.dup2(opened, fd)
    for opened in set(request["fds"]) - {0, 1, 2}:
        os.close(opened)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.stdin = open(0, closefd=False)
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=True)
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
        write_through=True)
    os.write(2, zygote.IMPORT_STDERR)
    stand_in = os.pidfd_open(request["stand_in"])
    threading.Thread(target=_die_with, args=(stand_in,), daemon=True, name="stand-in").start()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # from TMPDIR, which SLURM sets, when next asked
    sys.path[0] = os.getcwd()  # as -m sets it, not this script's folder
    sys.argv = [_task_file(), *request["argv"]]
    task_key.run_injected()  # helpers.inject's sitecustomize


def _die_with(stand_in: int) -> None:
    with selectors.DefaultSelector() as selector:
        selector.register(stand_in, selectors.EVENT_READ)
        selector.select()
    os.kill(os.getpid(), signal.SIGKILL)


def _task_file() -> str:
    spec = importlib.util.find_spec(task_key.TASK_MODULE)
    assert spec is not None and spec.origin is not None
    return spec.origin


if __name__ == "__main__":
    become(serve(sys.argv[1], int(sys.argv[2])))
    runpy.run_module(task_key.TASK_MODULE, run_name="__main__", alter_sys=True)
