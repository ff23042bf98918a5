"""A SLURM task's Python handed over to a zygote (``tests/task_zygote.py``): on the PYTHONPATH of
the environment the SLURM tests submit with, so every Python their tasks start runs it first.

In a ``python -u -m reproduce.launch.task_process FOLDER`` (the command of each task,
``launch.slurm.task_command``) whose environment has a zygote listening (``PYTEST_REPRODUCE_TASK_
ZYGOTES``: a folder of sockets, one per environment as the imports read it, ``key``), this
process sends the zygote its command, environment, folder and stdin, stdout and stderr, and
becomes the task's stand-in: it passes on every signal SLURM sends it (scancel's SIGTERM, the
time limit's USR2, a node's loss) to the process the zygote forked, and exits as that process
did, with its code or by its signal. That process dies with this one (a SLURM kill after
``KillWait``). A fresh task spends ~6 s of a core importing torch and Lightning; the SLURM tests
start ~30.

Anything else (another command, no zygote for this environment, one not yet listening) runs as
it would without this file, and so does a fault ``helpers.inject`` wrote (the sitecustomize
after this one on the path, which Python would have run)."""

import os
import signal
import sys

from task_key import TASK_LATER, TASK_MODULE, ZYGOTES_ENV, key, run_injected

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGCONT, signal.SIGQUIT)


def _hand_over() -> None:
    folder = os.environ.get(ZYGOTES_ENV)
    if not folder:
        return
    with open("/proc/self/cmdline", "rb") as f:
        argv = [a.decode(errors="surrogateescape") for a in f.read().split(b"\0")[:-1]]
    if argv[1:4] != ["-u", "-m", TASK_MODULE]:
        return
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, tests)
    try:
        import spawner  # tests/spawner.py: its messages, its list of what is read later
    finally:
        sys.path.remove(tests)
    import socket

    env = dict(os.environ)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(os.path.join(folder, key(env, spawner.READ_LATER + TASK_LATER) + ".sock"))
    except OSError:  # none for this environment, or not listening yet: a fresh task
        sock.close()
        return
    spawner._send(sock, {"argv": argv[4:], "env": env, "cwd": os.getcwd(),
                         "stand_in": os.getpid()}, [0, 1, 2])
    got = spawner._receive(sock)
    if got is None or got[0].get("pid") is None:  # declined, or the zygote died: fresh
        sock.close()
        return
    pid = got[0]["pid"]

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    ended = spawner._receive(sock)
    if ended is None:  # the zygote died: its child with this process
        forward(signal.SIGKILL, None)
    code = ended[0]["code"] if ended is not None else -signal.SIGKILL
    if code < 0:  # ended by a signal: so does this process, for SLURM to see
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


_hand_over()
run_injected()  # the fault's own sitecustomize, as Python would run it
