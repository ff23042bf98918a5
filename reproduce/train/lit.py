"""A thin LightningModule around the plain model: loss, schedule, dev perplexity.

Lightning does the loop, devices, precision, checkpointing and the progress bar; everything the
paper specifies lives in model.py and optim.py.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytorch_lightning as pl
import torch
from torch.optim.lr_scheduler import LRScheduler

from reproduce.config import Config
from reproduce.data import PAD_BATCH
from reproduce.errors import one_line
from reproduce.paper.model import Transformer
from reproduce.paper.optim import adam_with_schedule, output_loss
from reproduce.train.callbacks import LOG_EVERY
from reproduce.train.step_time import compiled_fast, fast_losses

log = logging.getLogger("reproduce")

WORK_KEYS = ("src_tokens", "tgt_tokens", "src_sq", "tgt_sq", "cross", "real_tgt_tokens")


class TranslationModule(pl.LightningModule):
    def __init__(self, config: dict):
        super().__init__()
        self.save_hyperparameters()  # the resolved config travels inside every checkpoint
        self.config = Config.from_dict(config)
        self.model = Transformer(self.config.model)
        self._dev = torch.zeros(2, dtype=torch.float64)  # (nll sum, target tokens)
        # What an evaluation pass logs as: "dev", or "train_sample" for the final weights' NLL
        # on a sample of the training pairs (runner.run_here)
        self.eval_name = "dev"
        # Work done so far, padded as computed, for the analytic FLOP count (reproduce.paper.flops):
        # B*S, B*T, B*S*S, B*T*T, B*T*S summed over micro-batches, and real target tokens.
        self.work = dict.fromkeys(WORK_KEYS, 0)
        # real target tokens since `work` was last brought up to date: kept where the loss is, so
        # a step never waits to read it back (a GPU would stall the host each step)
        self._real_tokens: torch.Tensor | None = None
        self.resumed_from: dict | None = None  # the checkpoint's step and layout, once resumed
        self.step_census: dict = {}  # what one steady step asked of the host (fit: StepCensus)
        # train.compile: the training loss under torch.compile (evaluation stays eager: its
        # shapes vary more and it runs once); compiled on the first step, as a function, so the
        # weights' names in checkpoints are the same either way. "auto" is decided by the runner
        # (train.compiling), which calls use_compiled.
        self.use_compiled(self.config.train.compile == "on")
        self.compile_failed: str | None = None  # why training went on eager, if it had to
        self.graphs_failed: str | None = None  # why it went on without CUDA graphs, if it had to
        self._loss_on_bar: bool | None = None  # the training loss on the progress bar
        self._micro_step, self._micro = -1, 0  # dropout's seed: optimizer step, micro-batch
        self._seed = 0  # the seed of this pass's dropout (on_train_batch_start)
        self._pass: tuple = ()  # (batch, loss, seed) of a pass under CUDA graphs (backward)

    def use_compiled(self, on: bool) -> None:
        """Train on the fast path (``on``): the training loss over every position of the batch
        (``_padded_losses``), compiled whole; or eager, the path every committed record took."""
        self.fast = on
        self._graphs = on and self.config.train.cuda_graphs
        self._train_losses = (compiled_fast(self._padded_losses, self._graphs)
                              if on else self._losses)

    def _fall_back(self, batch: dict[str, torch.Tensor], e: Exception):
        """The step's losses after the compiled path failed with ``e``: CUDA graphs that failed
        (their capture, say) give way to the same compiled loss without them; a compiler that
        failed (on the first step, or on a new shape later), to the same loss eager. From here
        on, said once and kept for the record; any other error is raised as it came."""
        if not self._graphs_failed(e):
            if self._train_losses is self._losses or not _compiler_error(e):
                raise e
            self.compile_failed = where = f"step {self.trainer.global_step}: {one_line(e)}"
            log.warning("torch.compile failed (%s); training goes on eager", where)
            self.use_compiled(False)
        try:
            return self._train_losses(batch)
        except Exception as again:  # noqa: BLE001 - the next way down, or raised
            return self._fall_back(batch, again)

    def _graphs_failed(self, e: BaseException) -> bool:
        """Where CUDA graphs are on and ``e`` is theirs (or the compiler's under them): the loss
        goes on compiled without them from here, said once and kept for the record; True."""
        if not (self._graphs and (_compiler_error(e) or _capture_error(e))):
            return False
        where = f"step {self.trainer.global_step}: {one_line(e)}"
        self.graphs_failed, self._graphs = where, False
        log.warning("CUDA graphs failed (%s); training goes on compiled, without them", where)
        self._train_losses = compiled_fast(self._padded_losses, False)
        return True

    def backward(self, loss: torch.Tensor, *args, **kwargs) -> None:
        """Lightning's backward, where CUDA graphs that fail in it (a backward's capture, or the
        second backward of a step: pytorch/pytorch#169545) give way as in ``_fall_back``: the
        pass is taken again compiled without them, with the same dropout masks, under the run's
        autocast. With CUDA graphs a step is one pass on one device
        (``compiling.cuda_graphs_refusal``), so the pass's gradients, cleared first, are the
        step's."""
        try:
            super().backward(loss, *args, **kwargs)
        except Exception as e:
            if not self._graphs_failed(e):
                raise
            scale = loss.detach() / self._pass[1].detach()  # what Lightning divided the loss by
            self.zero_grad(set_to_none=True)
            torch.manual_seed(self._pass[2])
            with self.trainer.precision_plugin.forward_context():  # autocast, as training_step
                smoothed, _, n = self._train_losses(self._pass[0])
            super().backward(smoothed / n * scale, *args, **kwargs)

    def _losses(self, batch: dict[str, torch.Tensor]):
        hidden = self.model.features(batch["src"], batch["tgt_in"])
        pad = self.config.model.pad_id
        smoothed, nll = output_loss(hidden, self.model.embed.weight, batch["tgt_out"],
                                    self.config.train.eps_ls, pad)
        return smoothed, nll, (batch["tgt_out"] != pad).sum()

    def _padded_losses(self, batch: dict[str, torch.Tensor]):
        """``_losses`` with nothing read back to the host and every shape the batch's
        (``step_time.fast_losses``): the training loss of the fast path."""
        return fast_losses(self.model, batch, self.config.train.eps_ls, self.config.model.pad_id,
                           most_positions=self._micro_tokens)

    @property
    def _micro_tokens(self) -> int:
        """The most target positions a training batch of one device holds (the token budget of
        its micro-batch: ``TrainConfig.split_batch``), for the fast path's loss chunks."""
        world = self.trainer.world_size if self._trainer is not None else 1
        return self.config.train.split_batch(world)[1]

    def on_train_batch_start(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """Seed dropout from (seed, optimizer step, micro-batch within it, rank), so the masks
        depend on where the run is, not on how long this process has been running: a run
        resumed from a checkpoint draws the masks the uninterrupted run drew."""
        step = self.trainer.global_step
        self._micro = self._micro + 1 if step == self._micro_step else 0
        self._micro_step = step
        self._seed = int(np.random.SeedSequence(
            [self.config.train.seed, step, self._micro, self.global_rank]).generate_state(1)[0])
        torch.manual_seed(self._seed)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        try:
            smoothed, nll, n = self._train_losses(batch)
        except Exception as e:
            smoothed, nll, n = self._fall_back(batch, e)
        loss = smoothed / n
        if self._graphs:  # what backward needs to take the pass again (backward)
            self._pass = (batch, loss, self._seed)
        (B, S), T = batch["src"].shape, batch["tgt_in"].shape[1]
        for key, value in zip(WORK_KEYS[:-1], (B * S, B * T, B * S * S, B * T * T, B * T * S),
                              strict=True):  # the shapes' counts; real tokens are kept apart
            self.work[key] += value
        real = n.detach()  # a sum's first term copied: a CUDA graph's output is the next step's
        self._real_tokens = real.clone() if self._real_tokens is None else self._real_tokens + real
        # The progress bar reads its values back every step (Lightning's on_batch_end): the fast
        # path's loss goes to the loggers only, read at their interval (fixed for the run:
        # Lightning refuses a key logged with other options)
        if self._loss_on_bar is None:
            self._loss_on_bar = not self.fast
        self.log("train/loss", loss, prog_bar=self._loss_on_bar)
        self.log("train/nll", nll / n)
        if (self.trainer.global_step + 1) % LOG_EVERY == 0:
            # the steps Lightning hands its loggers (a number logged becomes a tensor on the
            # device: on a GPU, a copy the host waits for); the loggers see what they saw
            scheduler = self.lr_schedulers()
            assert isinstance(scheduler, LRScheduler)  # one, configure_optimizers's
            self.log("train/lr", scheduler.get_last_lr()[0])
        self.log("train/tgt_tokens", n.float(), reduce_fx="sum")
        return loss

    def on_validation_epoch_start(self) -> None:
        self._dev = torch.zeros(2, dtype=torch.float64, device=self.device)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        if PAD_BATCH in batch:  # several ranks: an empty turn so all run as many steps
            return
        _, nll, n = self._losses(batch)
        self._dev += torch.stack([nll.double(), n.double()])

    def on_validation_epoch_end(self) -> None:
        total = self._summed(self._dev)
        nll = (total[0] / total[1].clamp(min=1)).item()
        # Already the total over ranks (all_gather above); sync_dist averages equal values.
        self.log(f"{self.eval_name}/nll", nll, sync_dist=True)
        self.log(f"{self.eval_name}/ppl", math.exp(min(nll, 50.0)), prog_bar=True, sync_dist=True)

    def _work_now(self) -> dict[str, int]:
        """``work`` with the real target tokens counted since it was last brought up to date
        (one read back to the host: a checkpoint's, or the run's end)."""
        if self._real_tokens is not None:
            self.work["real_tgt_tokens"] += int(self._real_tokens)
            self._real_tokens = None
        return self.work

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["work"] = dict(self._work_now())
        checkpoint["layout"] = {"world_size": self.trainer.world_size,
                                "accumulate": self.trainer.accumulate_grad_batches}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.work = {**self.work, **checkpoint.get("work", {})}
        # Checkpoints made before layouts were recorded come from one process.
        self.resumed_from = {"step": checkpoint.get("global_step"),
                             **checkpoint.get("layout", {"world_size": 1})}

    def _summed(self, local: torch.Tensor) -> torch.Tensor:
        """``local`` summed over every rank (one process: itself)."""
        gathered = self.all_gather(local)
        assert isinstance(gathered, torch.Tensor)  # a tensor in, a tensor out
        return gathered.sum(0) if gathered.dim() > local.dim() else gathered  # (world, ...) in DDP

    def total_work(self) -> dict[str, int]:
        """`work` summed over all devices (each rank counts its own batches)."""
        work = self._work_now()
        local = torch.tensor([work[k] for k in WORK_KEYS], dtype=torch.float64,
                             device=self.device)
        total = self._summed(local)
        return {k: int(v) for k, v in zip(WORK_KEYS, total.tolist(), strict=True)}

    def configure_optimizers(self):
        optimizer, schedule = adam_with_schedule(self.parameters(), self.config.train,
                                                 self.config.model.d_model)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": schedule, "interval": "step", "frequency": 1}}


def _capture_error(e: BaseException) -> bool:
    """Whether ``e`` is a CUDA graph's failure (its capture, its replay's memory pool)."""
    text = f"{type(e).__module__}.{type(e).__name__}: {e}".lower()
    return "cudagraph" in text or "graph capture" in text or "capturing" in text


def _compiler_error(e: BaseException) -> bool:
    """Whether ``e`` comes from ``torch.compile``'s machinery (dynamo, inductor, a backend), not
    from the computation (out of memory, bad input), which is raised as it would be eager."""
    return type(e).__module__.startswith(("torch._dynamo", "torch._inductor"))
