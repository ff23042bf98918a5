"""Training steps side by side: ours (plain loop and Lightning loop, optionally compiled),
torch.nn.Transformer and MarianMT, on the same batches."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from reproduce.bench.inputs import BOS, EOS, OURS, Plan, batch_flops, real_tokens
from reproduce.bench.peers import (
    TorchTransformer,
    copy_into_marian,
    copy_into_torch,
    marian,
    marian_logits,
    smoothed_cross_entropy,
    trainable_parameters,
)
from reproduce.bench.timing import Result, interleaved, precision_context
from reproduce.config import Config
from reproduce.paper.optim import adam_with_schedule
from reproduce.train.lit import TranslationModule


def plain_step(model: torch.nn.Module, loss: Callable, config: Config, precision: str):
    """One training step per batch: forward, loss / tokens, backward, Adam, schedule."""
    optimizer, schedule = adam_with_schedule(
        [p for p in model.parameters() if p.requires_grad], config.train, config.model.d_model)

    def run(batches: list[dict[str, torch.Tensor]]) -> None:
        model.train()
        for batch in batches:
            with precision_context(precision):
                total, n = loss(batch)
            (total / n).backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
    return run


def lightning_loop(module, precision: str):
    """The module trained by a Lightning ``Trainer`` over the batches; the loop's seconds."""
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader

    class Clock(pl.Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            self.start = time.perf_counter()

        def on_train_end(self, trainer, pl_module) -> None:
            self.seconds = time.perf_counter() - self.start

    def run(batches: list[dict[str, torch.Tensor]]) -> float:
        clock = Clock()
        trainer = pl.Trainer(max_steps=len(batches), max_epochs=1, accelerator="cpu", devices=1,
                             precision=precision, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             num_sanity_val_steps=0, limit_val_batches=0, callbacks=[clock])
        trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None))
        return clock.seconds
    return run


def compile_stats() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "recompiles": sum(counters["recompiles"].values())}


def bench_training(config: Config, batches: list[dict[str, torch.Tensor]], plan: Plan,
                   precision: str, use_compile: bool, lightning: bool,
                   ) -> tuple[list[Result], dict[str, float]]:
    """Training throughput of every contender on the same batches, and each one's loss on the
    first batch (eval mode, same weights): the same function gives the same number."""
    c = config.model
    torch.manual_seed(config.train.seed)
    module = TranslationModule(config.to_dict())

    def our_loss(m):
        def loss(batch):
            smoothed, _, n = m._losses(batch)
            return smoothed, n
        return loss

    def peer_loss(forward):
        def loss(batch):
            logits = forward(batch)
            return (smoothed_cross_entropy(logits, batch["tgt_out"], config.train.eps_ls, c.pad_id),
                    (batch["tgt_out"] != c.pad_id).sum())
        return loss

    models: dict[str, tuple[torch.nn.Module, Callable]] = {OURS: (module.model, our_loss(module))}
    if lightning:
        models["ours, Lightning loop"] = (module.model, None)
    if use_compile:  # nn.Module.compile keeps the state_dict's keys (checkpoints load unchanged)
        compiled = TranslationModule(config.to_dict())
        compiled.model.load_state_dict(module.model.state_dict())
        compiled.model.compile()
        models["ours, torch.compile"] = (compiled.model, our_loss(compiled))
    torch_nn = TorchTransformer(c)
    copy_into_torch(module.model, torch_nn)
    models["torch.nn.Transformer"] = (torch_nn, peer_loss(lambda b: torch_nn(b["src"], b["tgt_in"])))
    try:
        mt = marian(c, BOS, EOS)
        copy_into_marian(module.model, mt)
        models["MarianMT (transformers)"] = (
            mt, peer_loss(lambda b: marian_logits(mt, b["src"], b["tgt_in"], c.pad_id)))
    except ImportError:
        pass

    first_loss = {}
    with torch.no_grad():
        for name, (model, loss) in models.items():
            if loss is not None and "compile" not in name:
                model.eval()
                total, n = loss(batches[0])
                first_loss[name] = float(total / n)

    runs = {name: (lightning_loop(module, precision) if loss is None
                   else plain_step(model, loss, config, precision))
            for name, (model, loss) in models.items()}
    compile_seconds, stats = 0.0, {}
    if use_compile:
        start = time.perf_counter()
        runs["ours, torch.compile"](batches)  # compiles for the shapes it sees
        compile_seconds = time.perf_counter() - start
        stats = compile_stats()
    times = interleaved({name: (lambda run=run: run(batches)) for name, run in runs.items()},
                        plan.rounds)
    tokens = sum(real_tokens(b) for b in batches)
    flops = sum(batch_flops(c, b) for b in batches)
    results = []
    for name, (model, _) in models.items():
        r = Result(name, trainable_parameters(model), times[name], tokens, flops)
        if name == "ours, torch.compile":
            after = compile_stats()
            r.note = (f"first pass {compile_seconds:.0f} s (compiling); {stats['graphs']} graphs; "
                      f"{after['recompiles'] - stats['recompiles']} recompiles while measured")
        results.append(r)
    return results, first_loss
