"""The real CLI in a subprocess, with results and runs in a folder of the test's own; the
label-smoothed loss written plainly, the reference for ``optim.output_loss``."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

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
    if forkable(env):
        out = _zygote(env).run(command, env, cwd or Path.cwd())
    else:
        out = subprocess.run(command, capture_output=True, text=True, env=env, check=False,
                             timeout=TIMEOUT, cwd=cwd)
    if check and out.returncode != 0:
        raise AssertionError(f"exit {out.returncode}\n{out.stdout}\n{out.stderr}")
    return out


TIMEOUT = 600
# what the zygote's imports did not read: a CLI forked from it with other values of these behaves
# as a fresh one (its results and runs folders, W&B's settings, the seed Lightning leaves in the
# environment of a test that trained in its own process, pytest's own variables, SLURM's, read
# when a job is submitted or a run's cluster environment is built, and the pointer torch's
# inductor sets before each compiled library it loads reads it, which an in-process compile
# leaves behind: without it, no later CLI call of that worker was forked)
READ_LATER = ("REPRODUCE_", "WANDB_", "PL_GLOBAL_SEED", "PL_SEED_WORKERS", "PYTEST_", "SLURM_",
              "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR")
# read by torch once: a zygote for each value a test asks for (cli_env's threads)
PER_ZYGOTE = ("OMP_NUM_THREADS",)
# the environment the session's tests start from (conftest.py)
SESSION_ENV: dict[str, str] = {}


def forkable(env: dict[str, str]) -> bool:
    """Whether a CLI with ``env`` may be forked from a zygote: it differs from the session's
    environment only in variables read later, or in a zygote's own."""
    return bool(SESSION_ENV) and all(
        key.startswith(READ_LATER) or key in PER_ZYGOTE for key in env.keys() | SESSION_ENV.keys()
        if env.get(key) != SESSION_ENV.get(key))


class _Zygote:
    """``tests/zygote.py`` started with ``env``, on first use and again if it died."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.process: subprocess.Popen | None = None

    def run(self, command: list[str], env: dict[str, str],
            cwd: Path) -> subprocess.CompletedProcess:
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("zygote.py"))], env=self.env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdin is not None and self.process.stdout is not None
        with tempfile.TemporaryDirectory(prefix="cli-") as folder:
            out, err = Path(folder, "stdout"), Path(folder, "stderr")
            try:
                self.process.stdin.write(json.dumps({
                    "argv": command[3:], "env": env, "cwd": str(cwd), "stdout": str(out),
                    "stderr": str(err)}) + "\n")
                self.process.stdin.flush()
                pid = int(self.process.stdout.readline())
                killed = threading.Event()
                timer = threading.Timer(TIMEOUT, _kill, (pid, killed))
                timer.start()
                code = int(self.process.stdout.readline())
                timer.cancel()
            except (OSError, ValueError):  # the zygote died, or its answers are out of step
                self.process.kill()
                self.process.wait()
                self.process = None
                raise
            if killed.is_set():
                raise subprocess.TimeoutExpired(command, TIMEOUT, out.read_text(errors="replace"),
                                                err.read_text(errors="replace"))
            return subprocess.CompletedProcess(command, code, out.read_text(errors="replace"),
                                               err.read_text(errors="replace"))

    def close(self) -> None:
        """End it (its stdin closed) and wait for it."""
        if self.process is not None:
            self.process.communicate(timeout=60)
            self.process = None


def _kill(pid: int, killed: threading.Event) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        killed.set()
    except ProcessLookupError:  # it ended as the timer fired
        pass


_zygotes: dict[tuple, _Zygote] = {}


def _zygote(env: dict[str, str]) -> _Zygote:
    key = tuple(env.get(k) for k in PER_ZYGOTE)
    if key not in _zygotes:
        own = {k: v for k, v in zip(PER_ZYGOTE, key, strict=True) if v is not None}
        session = {k: v for k, v in SESSION_ENV.items() if k not in PER_ZYGOTE}
        _zygotes[key] = _Zygote({**session, **own})
    return _zygotes[key]


def close_zygotes() -> None:
    for zygote in _zygotes.values():
        zygote.close()


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
    ``sitecustomize`` on PYTHONPATH): a fault injected into the real CLI, e.g. a write that fails
    or a step that runs out of memory."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(code)
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH"))
                                                 if p)}


def data_module(corpus: str, tokenizer, cache_dir=None, **fields):
    """A ``TranslationData`` of ``corpus`` from a config with ``fields`` (config field names:
    batch_tokens, max_train_pairs, data_dir, seed, ...), as a run builds it."""
    from reproduce.config import Config
    from reproduce.data.module import TranslationData

    if "data_dir" in fields:
        fields["data_dir"] = str(fields["data_dir"])
    return TranslationData(Config().overrides(corpus=corpus, **fields), tokenizer,
                           cache_dir=cache_dir)
