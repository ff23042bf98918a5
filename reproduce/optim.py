"""Optimisation of section 5.3-5.4: Adam, the warm-up schedule and the label-smoothed loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .config import TrainConfig


def lrate(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """Equation 3: d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5); step counts from 1."""
    step = max(step, 1)
    return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)


def adam_with_schedule(params, train: TrainConfig, d_model: int):
    """Adam(beta1 0.9, beta2 0.98, eps 1e-9) with the learning rate set by `lrate` at every step.

    torch's fused Adam (one kernel for all parameters) where every parameter lives on a CPU or
    CUDA device: the same update, 4x faster than the per-tensor loop torch uses on CPUs by default
    (5 against 21 ms per step at the `cpu` scale, benchmarks: 1 thread on the 2-core EPYC).
    """
    params = list(params)
    fused = bool(params) and all(p.device.type in ("cpu", "cuda") and p.is_floating_point()
                                 for p in params)
    optimizer = torch.optim.Adam(params, lr=1.0, betas=(train.adam_beta1, train.adam_beta2),
                                 eps=train.adam_eps, fused=fused or None)
    # LambdaLR multiplies lr=1.0 by the factor; it is called with 0 before the first step.
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: lrate(i + 1, d_model, train.warmup_steps, train.lr_scale))
    return optimizer, schedule


def accumulation(batch_tokens: int, device_batch_tokens: int, devices: int) -> tuple[int, int]:
    """(micro-batches accumulated per step, tokens per micro-batch per device) so that
    devices x accumulated x micro-batch tokens reaches the paper's tokens per step (5.1).

    Pitfall this avoids: fewer GPUs than the paper's 8 silently train with smaller batches."""
    per_device = -(-batch_tokens // devices)  # ceil
    limit = device_batch_tokens or per_device
    accumulate = -(-per_device // limit)
    return accumulate, -(-per_device // accumulate)


class _SmoothedLoss(torch.autograd.Function):
    """The smoothed loss and NLL of ``smoothed_loss`` with a hand-written backward: the gradient
    of the smoothed cross-entropy with respect to the logits is softmax - q (q: 1 - eps_ls on the
    target, eps_ls / V everywhere), written in three passes over the (tokens, V) logits instead of
    autograd's scatter into zeros, mean backward and log-softmax backward. The same gradient (to
    float rounding, tests/test_train.py). On the 2-core AMD EPYC at the `cpu` scale
    (``python benchmarks/loss.py [--threads 1]``, 2026-11-24): the loss's forward and backward
    1.4x faster (85 against 121 ms at 2 threads, 139 against 202 at 1); base's whole training
    step 1.09x at 1 thread (1.45 against 1.58 s; the same in an earlier A/B), at 2 threads 1.03x
    in one run and 1.10x in another, both within the rounds' spread."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, keep: Tensor, eps_ls: float):
        # fp32 at least (bf16 logits under autocast; float64 stays float64)
        logp = F.log_softmax(logits.float() if logits.element_size() < 4 else logits, dim=-1)
        nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)[keep].sum()
        uniform = -logp.mean(dim=-1)[keep].sum()
        ctx.save_for_backward(logp, target, keep)
        ctx.eps_ls, ctx.dtype = eps_ls, logits.dtype
        ctx.mark_non_differentiable(nll)  # for logging and perplexity
        return (1.0 - eps_ls) * nll + eps_ls * uniform, nll

    @staticmethod
    def backward(ctx, grad_smoothed: Tensor, grad_nll: Tensor):
        logp, target, keep = ctx.saved_tensors
        eps, vocab = ctx.eps_ls, logp.shape[-1]
        grad = torch.exp(logp).sub_(eps / vocab)  # softmax - eps / V
        index = target.unsqueeze(-1)
        grad.scatter_add_(-1, index, torch.full(index.shape, eps - 1.0, dtype=grad.dtype,
                                                device=grad.device))  # - (1 - eps) on the target
        grad.mul_((grad_smoothed * keep).unsqueeze(-1).to(grad.dtype))
        return grad.to(ctx.dtype), None, None, None


def smoothed_loss(logits: Tensor, target: Tensor, eps_ls: float, pad_id: int) -> tuple[Tensor, Tensor]:
    """Label-smoothed cross-entropy summed over non-pad tokens, and the plain NLL sum.

    Smoothing spreads eps_ls uniformly over the vocabulary (Szegedy et al. 2016, as the paper;
    the same loss as ``F.cross_entropy(label_smoothing=eps_ls)``), from one log-softmax so the
    unsmoothed NLL (for perplexity) comes for free; its gradient is written out (``_SmoothedLoss``).
    Divide by the token count for means. The NLL has no gradient: it is for logging and perplexity.
    """
    return _SmoothedLoss.apply(logits, target, target != pad_id, eps_ls)
