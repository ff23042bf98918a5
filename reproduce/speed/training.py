"""Training steps side by side: ours (plain loop and Lightning loop, optionally compiled),
torch.nn.Transformer and MarianMT, on the same batches."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import cast

import torch

from reproduce.config import Config
from reproduce.paper.optim import adam_with_schedule
from reproduce.speed.inputs import BOS, COMPILED, EOS, OURS, Plan, batch_flops, real_tokens
from reproduce.speed.peers import (
    TorchTransformer,
    copy_into_marian,
    copy_into_torch,
    marian,
    marian_logits,
    smoothed_cross_entropy,
    trainable_parameters,
)
from reproduce.speed.timing import Result, interleaved, precision_context
from reproduce.train.lit import TranslationModule
from reproduce.train.step_time import compile_stats


def plain_step(model: torch.nn.Module, loss: Callable, config: Config, precision: str,
               losses: list[float] | None = None):
    """One training step per batch: forward, loss / tokens, backward, Adam, schedule. ``losses``:
    each step's loss is appended (a host sync per step: for checks, not while timing)."""
    optimizer, schedule = adam_with_schedule(
        [p for p in model.parameters() if p.requires_grad], config.train, config.model.d_model)

    def run(batches: list[dict[str, torch.Tensor]]) -> None:
        model.train()
        for batch in batches:
            with precision_context(precision):
                total, n = loss(batch)
            step_loss = total / n
            step_loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            if losses is not None:
                losses.append(float(step_loss))
    return run


def module_loss(module: TranslationModule) -> Callable:
    """``module``'s training loss of a batch as its training steps compute it, (smoothed loss
    sum, target tokens): under ``torch.compile`` where its config sets ``train.compile``
    (compiled lazily, on the first call and again for new shapes or precisions;
    ``compile_stats`` counts the graphs)."""
    def loss(batch):
        smoothed, _, n = module._train_losses(batch)
        return smoothed, n
    return loss


def lightning_loop(module, precision: str):
    """The module trained by a Lightning ``Trainer`` over the batches; the loop's seconds."""
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader, Dataset

    class Clock(pl.Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            self.start = time.perf_counter()

        def on_train_end(self, trainer, pl_module) -> None:
            self.seconds = time.perf_counter() - self.start

    def run(batches: list[dict[str, torch.Tensor]]) -> float:
        clock = Clock()
        trainer = pl.Trainer(max_steps=len(batches), max_epochs=1, accelerator="cpu", devices=1,
                             precision=precision,  # type: ignore[arg-type]  # one of PRECISIONS
                             logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             num_sanity_val_steps=0, limit_val_batches=0, callbacks=[clock])
        trainer.fit(module, train_dataloaders=DataLoader(cast(Dataset, batches), batch_size=None))
        return clock.seconds
    return run


def bench_training(config: Config, batches: list[dict[str, torch.Tensor]], plan: Plan,
                   precisions: list[str], use_compile: bool, lightning: bool,
                   ) -> tuple[list[Result], dict[str, float]]:
    """Training throughput of every contender in each of ``precisions`` on the same batches,
    interleaved, and each one's loss on the first batch (eval mode, fp32, same weights): the same
    function gives the same number."""
    c = config.model
    torch.manual_seed(config.train.seed)
    module = TranslationModule(config.to_dict())
    our_loss = module_loss

    def peer_loss(forward):
        def loss(batch):
            logits = forward(batch)
            return (smoothed_cross_entropy(logits, batch["tgt_out"], config.train.eps_ls, c.pad_id),
                    (batch["tgt_out"] != c.pad_id).sum())
        return loss

    # a contender: its model, and its loss on a batch (None: the Lightning loop trains it)
    models: dict[str, tuple[torch.nn.Module, Callable | None]] = {
        OURS: (module.model, our_loss(module))}
    if lightning:
        models["ours, Lightning loop"] = (module.model, None)
    if use_compile:
        compiled = TranslationModule(config.overrides(compile=True).to_dict())  # as a run compiles
        compiled.model.load_state_dict(module.model.state_dict())
        models[COMPILED] = (compiled.model, module_loss(compiled))
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
            if loss is not None and name != COMPILED:
                model.eval()
                total, n = loss(batches[0])
                first_loss[name] = float(total / n)

    runs: dict[tuple[str, str], Callable[[list[dict[str, torch.Tensor]]], float]] = {
        (name, p): (lightning_loop(module, p) if loss is None
                    else plain_step(model, loss, config, p))
        for p in precisions for name, (model, loss) in models.items()}
    notes: dict[tuple[str, str], str] = {}
    if use_compile:
        from torch._dynamo.utils import counters

        counters.clear()  # graphs of our model alone, not of anything compiled before
        for p in precisions:
            start = time.perf_counter()
            runs[(COMPILED, p)](batches)  # compiles for the shapes and the precision it meets
            seconds = time.perf_counter() - start
            stats = compile_stats()
            notes[(COMPILED, p)] = (f"first pass {seconds:.0f} s (compiling); {stats['graphs']} "
                                    "graphs so far" + ("" if stats["graphs"] else
                                                       ": NOT compiled, this row ran eager"))
        before = compile_stats()["recompiles"]
    times = interleaved({key: partial(run, batches) for key, run in runs.items()}, plan.rounds)
    tokens = sum(real_tokens(b) for b in batches)
    flops = sum(batch_flops(c, b) for b in batches)
    results = []
    for (name, p), per_round in times.items():
        r = Result(name, trainable_parameters(models[name][0]), per_round, tokens, flops,
                   precision=p)
        if name == COMPILED:
            r.note = (f"{notes[(name, p)]}; {compile_stats()['recompiles'] - before} recompiles "
                      "while measured (all precisions)")
        results.append(r)
    return results, first_loss
