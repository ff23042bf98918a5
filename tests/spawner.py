"""The Pythons a forked CLI starts itself (a run's ranks, ``--workers``' workers), forked too.

A CLI forked from a zygote (``tests/zygote.py``) that may start ``python -m reproduce ...``
itself (``wants_spawner``: ``--devices``, ``--workers``, rank 0 of a run) first forks a copy of
itself, the *spawner*, while it is still one thread with torch's thread pool not started (as the
zygote is), and replaces ``subprocess.Popen``: a ``[sys.executable, "-m", "reproduce", ...]``
whose environment differs from the CLI's only in what is read after the imports (``LATER``) is
forked by the spawner, with the caller's stdin, stdout and stderr (or its pipe), working folder,
environment, session and signal dispositions, and runs the CLI as a fresh one would; anything
else is a real ``Popen``. Each such process would spend ~6 s of a core importing torch and
Lightning (issue 82). The real ``Popen`` of ranks and workers stays proven where a test starts a
fresh CLI (``test_workers_flag_trains_runs_in_parallel_and_renders_once``, the SLURM node-lost
test's local run).

What the product sees is a ``Popen``'s: a pid (its own process group where
``start_new_session`` asked for one, made before the pid is answered), ``poll``, ``wait``,
``returncode``, ``send_signal``, ``terminate``, ``kill`` and ``stdout``. The forked process's
parent is the spawner, not the CLI; the spawner dies with the CLI (``PR_SET_PDEATHSIG``) and
ignores the signals sent to the CLI's process group, so a rank that dies with its parent
(``train.devices.die_with_parent``) still dies with the CLI, one process later."""

from __future__ import annotations

import ctypes
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

# what the zygote's imports did not read: a CLI forked from it with other values of these behaves
# as a fresh one (its results and runs folders, W&B's settings, the seed Lightning leaves in the
# environment of a test that trained in its own process, pytest's own variables, SLURM's, read
# when a job is submitted or a run's cluster environment is built, and the pointer torch's
# inductor sets before each compiled library it loads reads it, which an in-process compile
# leaves behind: without it, no later CLI call of that worker was forked; and the flag joblib sets
# for Intel's OpenMP runtime, which torch here does not use, as a test first scores BLEU in its own
# process: sacremoses imports joblib; and Kineto's log level, which a run's step census sets in
# the process that trains and Kineto reads when it first profiles)
READ_LATER = ("REPRODUCE_", "WANDB_", "PL_GLOBAL_SEED", "PL_SEED_WORKERS", "PYTEST_", "SLURM_",
              "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR", "KMP_INIT_AT_FORK", "KINETO_LOG_LEVEL")
# and besides those, what a process a CLI starts may differ in: the ranks' rendezvous that
# Lightning's launcher and the sweep set, and the threads (set again in the forked process: torch
# read them at import)
LATER = READ_LATER + ("PL_", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK",
                      "WORLD_SIZE", "RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS",
                      "MKL_NUM_THREADS")
MODULES = ("reproduce", "reproduce.__main__")
# a folder of a file per forked process, its command and environment: its /proc shows the
# zygote's (``helpers.processes``)
REGISTRY_ENV = "REPRODUCE_TEST_SPAWNED"
PR_SET_PDEATHSIG = 1
_HEADER = struct.Struct("!I")


def wants_spawner(argv: list[str], env: dict[str, str]) -> bool:
    """Whether a CLI with ``argv`` may start CLIs itself: ranks, workers (rank 0 starts the
    others; they start none). ``REPRODUCE_TEST_SPAWNER=0``: none does (every Python fresh, to
    tell a failure of this module from the product's)."""
    if env.get("REPRODUCE_TEST_SPAWNER") == "0":
        return False
    if argv[:1] == ["_rank-run"]:
        return env.get("LOCAL_RANK", "0") == "0"
    return any(flag in argv[:-1] and argv[argv.index(flag) + 1] != "1"
               for flag in ("--devices", "--workers"))


def start() -> dict | None:
    """Fork the spawner. Here (the CLI): ``Popen`` replaced, None. In a process the spawner
    forked: its request (``become``'s to apply), for the caller to run as a CLI."""
    sys.stdout.flush()
    sys.stderr.flush()
    mine, theirs = socket.socketpair()
    base, owner = dict(os.environ), os.getpid()
    pid = os.fork()
    if pid == 0:
        mine.close()
        try:
            return _serve(theirs, owner)
        except BaseException:  # never into the caller's stack: the CLI's own code is there
            os._exit(1)
    theirs.close()
    subprocess.Popen = _popen_class(_Client(mine, pid, base))  # type: ignore[misc,assignment]
    return None


# --- the spawner ---------------------------------------------------------------------------------


def _serve(sock: socket.socket, owner: int) -> dict:
    """The spawner's loop: fork a process per request and answer its pid, then its exit code.
    Returns only in a forked process (its request); exits when the CLI closes its end."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != owner:  # the CLI died before the line above took effect
        os._exit(1)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_IGN)  # sent to the CLI's process group: not for it
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    children: dict[int, int] = {}  # pidfd -> pid
    while True:
        for key, _ in selector.select():
            if key.fileobj is sock:
                got = _receive(sock)
                if got is None:  # the CLI closed its end: it is exiting
                    os._exit(0)
                request, fds = got
                ready_r, ready_w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    sock.close()
                    for fd in children:
                        os.close(fd)
                    os.close(ready_r)
                    request["fds"], request["ready"] = fds, ready_w
                    return request
                os.close(ready_w)
                for fd in set(fds):
                    os.close(fd)
                os.read(ready_r, 1)  # EOF once its session, streams and signals are set
                os.close(ready_r)
                pidfd = os.pidfd_open(pid)
                children[pidfd] = pid
                selector.register(pidfd, selectors.EVENT_READ)
                _send(sock, {"pid": pid, "id": request["id"]})
            else:
                pid = children.pop(key.fd)
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                _send(sock, {"ended": pid, "code": os.waitstatus_to_exitcode(status)})


def apply(request: dict) -> None:
    """In a forked process: the streams, session, signal dispositions, folder and environment
    its ``Popen`` asked for, all set before its pid is answered; registered (``REGISTRY_ENV``)."""
    stdin, stdout, stderr = request["fds"]
    for fd, opened in ((0, stdin), (1, stdout), (2, stderr)):
        os.dup2(opened, fd)
    for opened in set(request["fds"]) - {0, 1, 2}:
        os.close(opened)
    if request["new_session"]:
        os.setsid()
    sys.stdin = open(0, closefd=False)
    for name, signum in (("SIGINT", signal.SIGINT), ("SIGTERM", signal.SIGTERM),
                         ("SIGHUP", signal.SIGHUP), ("SIGUSR1", signal.SIGUSR1),
                         ("SIGUSR2", signal.SIGUSR2)):
        if request["ignored"].get(name):
            signal.signal(signum, signal.SIG_IGN)
        else:  # what a fresh Python starts with
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT
                          else signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if folder := request["env"].get(REGISTRY_ENV):  # what /proc says of a fresh one
        path = os.path.join(folder, str(os.getpid()))
        with open(path + ".tmp", "w") as f:
            json.dump({"command": [sys.executable, "-m", "reproduce", *request["argv"]],
                       "env": request["env"], "started": started(os.getpid())}, f)
        os.replace(path + ".tmp", path)
    os.close(request["ready"])


def set_threads() -> None:
    """The threads this process's environment asks for (torch read the zygote's at import):
    once no spawner is left to fork, as a thread pool may start here."""
    if threads := os.environ.get("OMP_NUM_THREADS"):
        import torch

        if torch.get_num_threads() != int(threads):
            torch.set_num_threads(int(threads))


def started(pid: int) -> int:
    """When ``pid`` started (clock ticks after boot): tells it from a later process of its pid."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def registered(folder: str, pid: int) -> dict | None:
    """The command and environment ``pid`` was forked with, if the spawner forked it."""
    try:
        with open(os.path.join(folder, str(pid))) as f:
            entry = json.load(f)
        return entry if entry["started"] == started(pid) else None
    except (OSError, ValueError):
        return None


# --- the CLI's side ------------------------------------------------------------------------------


class _Client:
    """The CLI's end of its spawner: requests sent under a lock, answers read by one thread."""

    def __init__(self, sock: socket.socket, pid: int, base: dict[str, str]):
        self.sock, self.spawner, self.base = sock, pid, base
        self.lock = threading.Lock()
        self.answered = threading.Condition()
        self.pids: dict[int, int] = {}  # request id -> pid
        self.asked = 0
        self.codes: dict[int, int] = {}
        self.lost = False
        threading.Thread(target=self._read, daemon=True, name="spawner-answers").start()

    def forkable(self, env: dict[str, str]) -> bool:
        """Whether a process with ``env`` behaves as a fresh one when forked: it differs from
        the CLI's only in what is read later, and sets the threads where it changes them."""
        differ = {key for key in env.keys() | self.base.keys() if env.get(key) != self.base.get(key)}
        return not self.lost and all(key.startswith(LATER) for key in differ) and (
            "OMP_NUM_THREADS" not in differ or env.get("OMP_NUM_THREADS", "").isdigit())

    def spawn(self, request: dict, fds: list[int]) -> int:
        with self.lock:
            self.asked += 1
            asked = request["id"] = self.asked  # an answer is its request's, however late
            _send(self.sock, request, fds)
        with self.answered:
            self.answered.wait_for(lambda: asked in self.pids or self.lost)
            if asked not in self.pids:
                raise OSError(f"the spawner (pid {self.spawner}) died")
            return self.pids.pop(asked)

    def _read(self) -> None:
        try:
            while (got := _receive(self.sock)) is not None:
                answer, _ = got
                with self.answered:
                    if "pid" in answer:
                        self.pids[answer["id"]] = answer["pid"]
                    else:
                        self.codes[answer["ended"]] = answer["code"]
                    self.answered.notify_all()
        finally:
            with self.answered:
                self.lost = True
                self.answered.notify_all()

    def wait(self, pid: int, timeout: float | None) -> int | None:
        """``pid``'s exit code, taken; None if it still runs after ``timeout`` seconds. With the
        spawner gone (the reaper of its processes is then init), from whether ``pid`` lives."""
        with self.answered:
            self.answered.wait_for(lambda: pid in self.codes or self.lost, timeout)
            if pid in self.codes:
                return self.codes.pop(pid)
        deadline = None if timeout is None else time.monotonic() + timeout
        while _alive(pid):
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.2)
        return -signal.SIGKILL  # its exit code went with the spawner


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _popen_class(client: _Client) -> type:
    real = subprocess.Popen

    class Popen(real):  # type: ignore[valid-type, misc]
        """``subprocess.Popen``, but a ``python -m reproduce`` is forked by the spawner."""

        def __new__(cls, args, *rest, **kwargs):
            env = kwargs.get("env")
            env = dict(os.environ if env is None else env)
            if rest or not _ours(args, kwargs) or not client.forkable(env):
                return super().__new__(cls)
            return _Spawned(client, list(args), env, kwargs)

    return Popen


ALLOWED = {"env", "cwd", "start_new_session", "stdout", "stderr", "text", "bufsize",
           "universal_newlines", "close_fds"}


def _ours(args, kwargs: dict) -> bool:
    return (isinstance(args, (list, tuple)) and len(args) >= 3 and args[0] == sys.executable
            and args[1] == "-m" and args[2] in MODULES and set(kwargs) <= ALLOWED
            and kwargs.get("stdout") in (None, subprocess.PIPE)
            and kwargs.get("stderr") in (None, subprocess.STDOUT))


class _Spawned:
    """A process the spawner forked, as the ``Popen`` the caller asked for."""

    def __init__(self, client: _Client, args: list[str], env: dict[str, str], kwargs: dict):
        self.args, self._client = args, client
        self.returncode: int | None = None
        self.stdin = self.stderr = self.stdout = None
        out = err = None
        if kwargs.get("stdout") == subprocess.PIPE:
            read, out = os.pipe()
            text = kwargs.get("text") or kwargs.get("universal_newlines")
            self.stdout = (os.fdopen(read, "r", buffering=1 if kwargs.get("bufsize") == 1 else -1)
                           if text else os.fdopen(read, "rb"))
        if kwargs.get("stderr") == subprocess.STDOUT:
            err = out if out is not None else 1
        ignored = {name: signal.getsignal(getattr(signal, name)) == signal.SIG_IGN
                   for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2")}
        request = {"argv": args[3:], "env": env, "cwd": str(kwargs.get("cwd") or os.getcwd()),
                   "new_session": bool(kwargs.get("start_new_session")), "ignored": ignored}
        try:
            self.pid = client.spawn(request, [0, out if out is not None else 1,
                                              err if err is not None else 2])
        finally:
            if out is not None:
                os.close(out)

    def poll(self) -> int | None:
        return self.wait(timeout=0) if self.returncode is None else self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if self.returncode is None:
            code = self._client.wait(self.pid, timeout)
            if code is None:
                if timeout == 0:
                    return None
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)  # (None waits)
            self.returncode = code
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


# --- messages: a length, JSON, and file descriptors beside it ------------------------------------


def _send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    socket.send_fds(sock, [_HEADER.pack(len(data))], fds or [])  # the descriptors with the length
    sock.sendall(data)


def _receive(sock: socket.socket) -> tuple[dict, list[int]] | None:
    """One message and the descriptors sent with it; None at the end of the stream."""
    try:
        first, fds, _, _ = socket.recv_fds(sock, _HEADER.size, 8)
    except OSError:
        return None
    if not first:
        return None
    while len(first) < _HEADER.size:
        more = sock.recv(_HEADER.size - len(first))
        if not more:
            return None
        first += more
    (size,) = _HEADER.unpack(first)
    data = b""
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            return None
        data += more
    return json.loads(data), list(fds)

