"""The training losses of Table 3's base at the ``smoke`` scale, step by step, as Lightning trains
it (fp32, dropout on, the run's own batches and dropout seeding): the values the eager path
and the fast path (``train.compile``) are held to (``tests/train/test_fast_step.py``).

``tests/golden/losses.json`` was written by ``python -m tests.golden`` at commit 5fab401 (main
before the fast path existed), with one torch thread, on the machine its ``hardware`` names."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch

FILE = Path(__file__).parent / "golden" / "losses.json"
STEPS = 20


class _Losses(pl.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


def config(steps: int = STEPS, **overrides):
    """Table 3's base at ``smoke``, trained ``steps`` steps, nothing saved or evaluated, in
    batches of 1024 tokens: the scale's batch when the values were written (now 512);
    ``overrides``: config fields changed beside (not the golden's values then)."""
    from reproduce.records.sweep import load_spec

    return load_spec("table3").resolve("base", "smoke").overrides(
        train_steps=steps, val_every_steps=0, ckpt_every_steps=0, batch_tokens=1024, **overrides)


def losses(steps: int = STEPS, compiled: bool = False, prepare=None, **overrides) -> list[float]:
    """The training loss of each of the first ``steps`` optimizer steps (the run's data, built in
    ``$REPRODUCE_CACHE``); ``compiled``: the training loss as ``train.compile`` runs it;
    ``prepare(module)``: a last change to the module before it trains; ``overrides``: as
    ``config``'s."""
    from reproduce.train.fit import build_data
    from reproduce.train.lit import TranslationModule

    c = config(steps, **overrides)
    pl.seed_everything(c.train.seed, workers=True, verbose=False)  # as runner.run_here
    _, data = build_data(c)
    module = TranslationModule(c.to_dict())
    module.use_compiled(compiled)
    if prepare is not None:
        prepare(module)
    record = _Losses()
    trainer = pl.Trainer(max_steps=steps, max_epochs=-1, precision="32-true", accelerator="cpu",
                         devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0, callbacks=[record],
                         accumulate_grad_batches=c.train.split_batch(1)[0])
    trainer.fit(module, datamodule=data)
    return record.losses


def hardware() -> dict[str, str]:
    """What a CPU's low bits depend on: its name and flags, and torch's version."""
    from reproduce.util.machine import cpu_flags, cpu_name

    return {"cpu": cpu_name(), "cpu_flags": ",".join(cpu_flags()), "torch": torch.__version__}


def main() -> None:
    import subprocess
    import tempfile

    from reproduce.paths import CACHE_ENV

    torch.set_num_threads(1)
    import os

    with tempfile.TemporaryDirectory() as cache:
        os.environ[CACHE_ENV] = cache
        values = losses()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    FILE.parent.mkdir(exist_ok=True)
    FILE.write_text(json.dumps({"what": "train loss of each optimizer step, table3 base, smoke, "
                                        "fp32, one thread", "commit": commit,
                                "hardware": hardware(), "losses": values}, indent=1) + "\n")
    print(f"{FILE}: {len(values)} losses", file=sys.stderr)


if __name__ == "__main__":
    main()
