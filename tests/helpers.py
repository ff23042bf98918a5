"""The real CLI in a subprocess, with results and runs in a folder of the test's own; the
label-smoothed loss written plainly, the reference for ``optim.output_loss``."""

import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

# W&B on, offline into the session's temp dir (conftest turns it off for the other tests)
WANDB_OFFLINE = {"WANDB_MODE": "offline"}


def cli_env(root: Path, threads: int = 1) -> dict[str, str]:
    """The environment of a CLI call whose results and runs go under ``root``."""
    return {**os.environ, "REPRODUCE_RESULTS": str(root / "results"),
            "REPRODUCE_RUNS": str(root / "runs"), "OMP_NUM_THREADS": str(threads)}


def cli(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``python -m reproduce *args``; with ``check``, a non-zero exit fails with its output."""
    out = subprocess.run([sys.executable, "-m", "reproduce", *args], capture_output=True,
                         text=True, env=env, check=False, timeout=600)
    if check and out.returncode != 0:
        raise AssertionError(f"exit {out.returncode}\n{out.stdout}\n{out.stderr}")
    return out


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
