"""The real CLI in a subprocess, with results and runs in a folder of the test's own; the
label-smoothed loss written plainly, the reference for ``optim.output_loss``."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from tests import spawner
from tests.task_hand_over.task_key import INJECTED  # a child forked from a zygote runs it

# W&B on, offline into the session's temp dir (conftest turns it off for the other tests)
WANDB_OFFLINE = {"WANDB_MODE": "offline"}


def cli_env(root: Path, threads: int = 1) -> dict[str, str]:
    """The environment of a CLI call whose results and runs go under ``root``."""
    return {**os.environ, "REPRODUCE_RESULTS": str(root / "results"),
            "REPRODUCE_RUNS": str(root / "runs"), "OMP_NUM_THREADS": str(threads)}


def cli(env: dict[str, str], *args: str, check: bool = True,
        cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m reproduce *args`` in ``cwd`` (default: this process's); with ``check``, a
    non-zero exit fails with its output. A process forked from a zygote (``tests/zygote.py``)
    where ``env`` allows it, else a fresh one."""
    command = [sys.executable, "-m", "reproduce", *args]
    if forkable(env) and (zygote := _free_zygote(env)) is not None:
        out = zygote.run(command, env, cwd or Path.cwd())
    else:
        out = subprocess.run(command, capture_output=True, text=True, env=env, check=False,
                             timeout=TIMEOUT, cwd=cwd)
    if check and out.returncode != 0:
        raise AssertionError(f"exit {out.returncode}\n{out.stdout}\n{out.stderr}")
    return out


def start(env: dict[str, str], *args: str, new_session: bool = False,
          sigint: bool = False) -> "Started | subprocess.Popen":
    """``python -m reproduce *args`` started, not waited for, its output captured: a ``Started``
    forked from a zygote where ``env`` allows it and the zygote is free, else a ``Popen``; both
    answer ``pid``, ``poll``, ``send_signal``, ``kill``, ``wait`` and ``communicate``.
    ``new_session``: in a process group of its own (``os.killpg(pid, ...)`` ends it and what it
    started); ``sigint``: Ctrl-C raises KeyboardInterrupt, as from a terminal (a suite started in
    the background hands its commands SIGINT ignored)."""
    command = [sys.executable, "-m", "reproduce", *args]
    if forkable(env) and (zygote := _free_zygote(env)) is not None:
        return zygote.start(command, env, Path.cwd(), new_session, sigint)
    return subprocess.Popen(command, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=new_session,
                            preexec_fn=_default_sigint if sigint else None)


def processes() -> Iterator[tuple[int, list[str], dict[str, str], str]]:
    """Every live process as ``(pid, command, environment, state)``, as it was started: from
    /proc, or for a Python a CLI's spawner forked (``tests/spawner.py``), whose /proc shows the
    zygote's, from its registry."""
    folder = os.environ.get(spawner.REGISTRY_ENV, "")
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[-1].split()[0]
            if (entry := spawner.registered(folder, int(proc.name)) if folder else None):
                command, env = entry["command"], entry["env"]
            else:
                command = [c.decode(errors="replace")
                           for c in (proc / "cmdline").read_bytes().split(b"\0")]
                env = dict(line.decode(errors="replace").partition("=")[::2]
                           for line in (proc / "environ").read_bytes().split(b"\0") if line)
        except OSError:
            continue
        yield int(proc.name), command, env, state


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


TIMEOUT = 600
# what the zygote's imports did not read (declared in tests/spawner.py, which forks by it too)
READ_LATER = spawner.READ_LATER
# read by torch once: a zygote for each value a test asks for (cli_env's threads)
PER_ZYGOTE = ("OMP_NUM_THREADS",)
# the environment the session's tests start from (conftest.py)
SESSION_ENV: dict[str, str] = {}


def forkable(env: dict[str, str]) -> bool:
    """Whether a CLI with ``env`` may be forked from a zygote: it differs from the session's
    environment only in variables read later, in a zygote's own, or in the PYTHONPATH of a fault
    ``inject`` adds (the child runs it as it starts)."""
    return bool(SESSION_ENV) and all(
        key.startswith(READ_LATER) or key in PER_ZYGOTE
        or (key == "PYTHONPATH" and env.get(key) in _paths_forkable(env))
        for key in differing(env))


def differing(env: dict[str, str]) -> list[str]:
    """The variables whose values in ``env`` differ from the session's (set in one only, too)."""
    return sorted(key for key in env.keys() | SESSION_ENV.keys()
                  if env.get(key) != SESSION_ENV.get(key))


def _paths_forkable(env: dict[str, str]) -> set[str]:
    """The session's PYTHONPATH with the folder of ``env``'s injected fault before it, or the
    folder that hands SLURM tasks over (``TASK_HAND_OVER``), or both."""
    session = SESSION_ENV.get("PYTHONPATH")
    paths = {_path_with(TASK_HAND_OVER, session)}
    if INJECTED in env:
        fault = Path(env[INJECTED]).parent
        paths |= {_path_with(fault, session), _path_with(fault, _path_with(TASK_HAND_OVER, session))}
    return paths


def _path_with(folder: Path, pythonpath: str | None) -> str:
    """``folder`` first on ``pythonpath``, but after ``TASK_HAND_OVER`` (its sitecustomize runs
    the one after it)."""
    rest = [p for p in (pythonpath or "").split(os.pathsep) if p]
    first = rest[:1] if rest[:1] == [str(TASK_HAND_OVER)] and folder != TASK_HAND_OVER else []
    return os.pathsep.join([*first, str(folder), *rest[len(first):]])


# a folder whose sitecustomize hands a SLURM task to a zygote (``tests/task_zygote.py``), on the
# PYTHONPATH the SLURM tests submit with
TASK_HAND_OVER = Path(__file__).with_name("task_hand_over")


class _Zygote:
    """``tests/zygote.py`` started with ``env``, on first use and again if it died; one child at
    a time (``busy`` while a started one runs)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.process: subprocess.Popen | None = None
        self.started: Started | None = None

    @property
    def busy(self) -> bool:
        return self.started is not None and not self.started.closed.is_set()

    def free(self) -> bool:
        """Not busy, waiting for a child that exited (killed, or waited for without its output)
        less than ``SETTLE`` seconds ago until its output is closed too: it is, a moment after,
        unless something it started still holds it."""
        started = self.started
        if self.busy and started is not None and started.exited_at is not None:
            started.closed.wait(max(0.0, started.exited_at + SETTLE - time.monotonic()))
        return not self.busy

    def run(self, command: list[str], env: dict[str, str],
            cwd: Path) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="cli-") as folder:
            out, err = Path(folder, "stdout"), Path(folder, "stderr")
            pid = self._fork(command, env, cwd, out, err, {})
            killed = threading.Event()
            timer = threading.Timer(TIMEOUT, _kill, (pid, killed))
            timer.start()
            code = self._exit_code()
            self._closed()
            timer.cancel()
            if killed.is_set():
                raise subprocess.TimeoutExpired(command, TIMEOUT, out.read_text(errors="replace"),
                                                err.read_text(errors="replace"))
            return subprocess.CompletedProcess(command, code, out.read_text(errors="replace"),
                                               err.read_text(errors="replace"))

    def start(self, command: list[str], env: dict[str, str], cwd: Path, new_session: bool,
              sigint: bool) -> "Started":
        folder = Path(tempfile.mkdtemp(prefix="cli-"))
        out, err = folder / "stdout", folder / "stderr"
        pid = self._fork(command, env, cwd, out, err,
                         {"new_session": new_session, "sigint": sigint})
        self.started = Started(command, pid, new_session, self._exit_code, self._closed, folder)
        return self.started

    def _fork(self, command: list[str], env: dict[str, str], cwd: Path, out: Path, err: Path,
              options: dict) -> int:
        """Ask for a child running ``command``; its pid."""
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("zygote.py"))], env=self.env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps({
                "argv": command[3:], "env": env, "cwd": str(cwd), "stdout": str(out),
                "stderr": str(err), **options}) + "\n")
            self.process.stdin.flush()
        except OSError:
            self._lost()
            raise
        return int(self._answer())

    def _exit_code(self) -> int:
        """The exit code of the child asked for last, once it has exited."""
        return int(self._answer())

    def _closed(self) -> None:
        """Once the child asked for last, and what it started, have closed its stdout and
        stderr."""
        if (line := self._answer()) != "closed":
            self._lost()
            raise ValueError(f"the zygote answered {line!r}, not 'closed'")

    def _answer(self) -> str:
        """The zygote's next line; if it died, or said what is no number, a new one next time."""
        assert self.process is not None and self.process.stdout is not None
        try:
            line = self.process.stdout.readline().strip()
            if line != "closed":
                int(line)
        except (OSError, ValueError):
            self._lost()
            raise
        return line

    def _lost(self) -> None:
        """The zygote died, or its answers are out of step: a new one next time."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def close(self) -> None:
        """End it (its stdin closed; a started child still running killed) and wait for it."""
        if self.busy:
            assert self.started is not None
            self.started.kill()
            self.started.closed.wait(60)
        if self.process is not None:
            self.process.communicate(timeout=60)
            self.process = None


class Started:
    """A CLI forked from a zygote and not waited for (``start``), as a ``Popen`` with its
    stdout and stderr captured: ``wait`` returns once it has exited, ``communicate`` once what
    it started has closed its output too."""

    def __init__(self, command: list[str], pid: int, group: bool, exit_code, closed,
                 folder: Path) -> None:
        self.args, self.pid, self.returncode = command, pid, None
        self._group, self._folder = group, folder
        self.exited, self.closed = threading.Event(), threading.Event()
        self.exited_at: float | None = None  # time.monotonic() when it exited
        threading.Thread(target=self._wait_for, args=(exit_code, closed), daemon=True).start()

    def _wait_for(self, exit_code, closed) -> None:
        try:
            self.returncode = exit_code()
            self.exited_at = time.monotonic()
            self.exited.set()
            closed()
        finally:
            self.exited_at = self.exited_at or time.monotonic()
            self.exited.set()
            self.closed.set()

    def poll(self) -> int | None:
        return self.returncode if self.exited.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self.exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        if self.returncode is None:
            raise RuntimeError(f"{self.args}: the zygote that forked it died")
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Its stdout and stderr, once it has ended and they are closed (its folder removed)."""
        self.wait(timeout)
        if not self.closed.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        if not self._folder.exists():
            raise RuntimeError(f"{self.args}: its output was read once already")
        out = tuple(Path(self._folder, name).read_text(errors="replace")
                    for name in ("stdout", "stderr"))
        shutil.rmtree(self._folder)
        return out  # type: ignore[return-value]

    def send_signal(self, signum: int) -> None:
        if not self.exited.is_set():  # else its pid may be another process's by now
            os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL, to its process group where it has one of its own."""
        if not self.exited.is_set():
            (os.killpg if self._group else os.kill)(self.pid, signal.SIGKILL)


def _kill(pid: int, killed: threading.Event) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        killed.set()
    except ProcessLookupError:  # it ended as the timer fired
        pass


_zygotes: dict[tuple, list[_Zygote]] = {}
# Zygotes for one thread count at most: another is started where each is busy (a started CLI
# still running, or something it left holding its output), as a fresh CLI would import as much
MOST = 2
SETTLE = 5.0  # seconds after a child exited that its output may take to close


def _free_zygote(env: dict[str, str]) -> _Zygote | None:
    """A free zygote for ``env``'s thread count: a started one, else a new one, up to ``MOST``;
    None where they are all busy."""
    key = tuple(env.get(k) for k in PER_ZYGOTE)
    pool = _zygotes.setdefault(key, [])
    if free := next((z for z in pool if z.free()), None):
        return free
    if len(pool) == MOST:
        return None
    own = {k: v for k, v in zip(PER_ZYGOTE, key, strict=True) if v is not None}
    session = {k: v for k, v in SESSION_ENV.items() if k not in PER_ZYGOTE}
    pool.append(_Zygote({**session, **own}))
    return pool[-1]


def close_zygotes() -> None:
    for pool in _zygotes.values():
        for zygote in pool:
            try:
                zygote.close()
            except subprocess.TimeoutExpired:  # something left holding a child's output
                zygote._lost()


def smoothed_loss(logits: torch.Tensor, target: torch.Tensor, eps_ls: float,
                  pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Label-smoothed cross-entropy summed over non-pad tokens (eps_ls spread uniformly over the
    vocabulary, as section 5.4 and ``F.cross_entropy(label_smoothing=eps_ls)``), and the plain NLL
    sum, left to autograd: what ``optim.output_loss`` computes in chunks with its own gradients."""
    logp = F.log_softmax(logits.float() if logits.element_size() < 4 else logits, dim=-1)
    keep = target != pad_id
    nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)[keep].sum()
    uniform = -logp.mean(dim=-1)[keep].sum()
    return (1.0 - eps_ls) * nll + eps_ls * uniform, nll.detach()


def inject(env: dict[str, str], folder: Path, code: str) -> dict[str, str]:
    """``env`` with ``code`` run at the start of every Python process it starts (a
    ``sitecustomize`` on PYTHONPATH, which a CLI forked from a zygote runs as it starts): a fault
    injected into the real CLI, e.g. a write that fails or a step that runs out of memory."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(code)
    return {**env, "PYTHONPATH": _path_with(folder, env.get("PYTHONPATH")),
            INJECTED: str(folder / "sitecustomize.py")}



# a fault for ``inject``: training steps of at least 0.25 s (or REPRODUCE_TEST_PACE_SECONDS) while
# the file REPRODUCE_TEST_PACE names exists (or always without it), so that a run is still training
# when a test's signal or SLURM's comes, however fast the machine; the steps compute what they
# would unpaced
PACED = '''
import os
import time
import reproduce.train.lit as lit

_train = lit.TranslationModule.training_step
_switch = os.environ.get("REPRODUCE_TEST_PACE")
_seconds = float(os.environ.get("REPRODUCE_TEST_PACE_SECONDS", "0.25"))

def paced_step(self, batch, batch_idx):
    if _switch is None or os.path.exists(_switch):
        time.sleep(_seconds)
    return _train(self, batch, batch_idx)

lit.TranslationModule.training_step = paced_step
'''


def data_module(corpus: str, tokenizer, cache_dir=None, **fields):
    """A ``TranslationData`` of ``corpus`` from a config with ``fields`` (config field names:
    batch_tokens, max_train_pairs, data_dir, seed, ...), as a run builds it."""
    from reproduce.config import Config
    from reproduce.data.module import TranslationData

    if "data_dir" in fields:
        fields["data_dir"] = str(fields["data_dir"])
    return TranslationData(Config().overrides(corpus=corpus, **fields), tokenizer,
                           cache_dir=cache_dir)


def treebank_sample_present() -> bool:
    """Whether NLTK finds its WSJ treebank sample (``NLTK_DATA``; not ours to ship)."""
    import nltk

    try:
        nltk.data.find("corpora/treebank/combined/")
    except LookupError:
        return False
    return True


def read_wandb(path: Path) -> list:
    """The records of an offline W&B run's ``.wandb`` file, as W&B's own protobuf messages
    (``wandb.proto.wandb_internal_pb2.Record``). W&B 0.31 ships no Python reader of the file
    (wandb-core, in Go, writes and syncs it); its framing is leveldb's log format: a 7-byte
    header (``:W&B``, magic 0xBEE1, version 0), then 32 KiB blocks of chunks, each a 7-byte
    header (CRC-32C, length, type: 1 whole, 2 first, 3 middle, 4 last) and its bytes, a
    block's last 6 bytes or fewer left as padding."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file"
    block, pos, whole, pending = 32768, 7, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 2):
            pending = chunk
        elif kind in (3, 4):
            pending += chunk
        if kind in (1, 4):
            whole.append(pending)
    records = []
    for raw in whole:
        record = pb.Record()
        record.ParseFromString(raw)
        records.append(record)
    return records


def wandb_runs(folder: Path) -> dict[str, dict]:
    """Every offline W&B run under ``folder`` by id, read back from its ``.wandb`` files (a run
    resumed in several folders is one id): its folders, tags, config, summary (the last value
    of each key) and the steps of its history."""
    runs: dict[str, dict] = {}
    for path in sorted(Path(folder).rglob("*.wandb")):
        for r in read_wandb(path):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                run = runs.setdefault(r.run.run_id, {"folders": [], "tags": set(), "config": {},
                                                     "summary": {}, "steps": []})
                run["folders"].append(path.parent)
                run["tags"] |= set(r.run.tags)
                run["config"].update({i.key: json.loads(i.value_json) for i in r.run.config.update})
            elif kind == "config":
                run["config"].update({i.key: json.loads(i.value_json) for i in r.config.update})
            elif kind == "summary":
                run["summary"].update({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                       for i in r.summary.update})
            elif kind == "history":
                run["steps"].append(r.history.step.num)
    return runs
