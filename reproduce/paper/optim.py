"""Optimisation of section 5.3-5.4: Adam, the warm-up schedule and the label-smoothed loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from reproduce.config import TrainConfig


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


def _minus_q_(probs: Tensor, target: Tensor, eps_ls: float) -> Tensor:
    """The smoothed loss's gradient with respect to the logits, softmax - q (q: 1 - eps_ls on the
    target, eps_ls / V everywhere), written over the softmax ``probs`` (.., V) in place."""
    index = target.unsqueeze(-1)
    return probs.sub_(eps_ls / probs.shape[-1]).scatter_add_(
        -1, index, torch.full(index.shape, eps_ls - 1.0, dtype=probs.dtype, device=probs.device))


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
        grad = _minus_q_(torch.exp(logp), target, ctx.eps_ls)
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


class _OutputLoss(torch.autograd.Function):
    """``smoothed_loss(hidden @ weight.T, ...)`` without the (tokens, V) logits in memory: the
    pre-softmax projection, the loss and both gradients are computed together, `rows` real target
    positions at a time (padding positions are skipped: their loss and gradient are zero). The
    gradients of a chunk (softmax - q, then through the projection) are taken in the forward pass,
    while its logits are in cache, and scaled by the incoming gradient in the backward. Matmuls run
    in the autocast dtype when autocast is on (as autograd's would), softmax and sums in fp32."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, target: Tensor, eps_ls: float, pad_id: int,
                rows: int):
        keep = target != pad_id
        h, t = hidden[keep], target[keep]  # (n, d), (n,)
        device = hidden.device.type
        dtype = (torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device)
                 else hidden.dtype)
        grads = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        vocab = weight.shape[0]
        acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        with torch.autocast(device, enabled=False):
            w = weight.to(dtype)
            nll = torch.zeros((), dtype=acc, device=hidden.device)
            uniform = torch.zeros((), dtype=acc, device=hidden.device)
            grad_h = torch.empty_like(h, dtype=acc) if grads else None
            grad_w = torch.zeros_like(weight, dtype=acc) if grads else None
            for start in range(0, h.shape[0], rows):
                hc, tc = h[start:start + rows].to(dtype), t[start:start + rows]
                logp = F.log_softmax((hc @ w.t()).to(acc), dim=-1)  # (rows, V)
                nll -= logp.gather(-1, tc[:, None]).sum()
                uniform -= logp.sum() / vocab
                if grads:
                    g = _minus_q_(logp.exp_(), tc, eps_ls).to(dtype)
                    grad_h[start:start + rows] = g @ w
                    grad_w += (g.t() @ hc).to(acc)
        if grads:
            full = torch.zeros_like(hidden, dtype=acc)
            full[keep] = grad_h
            ctx.save_for_backward(full, grad_w)
            ctx.dtypes = hidden.dtype, weight.dtype
        ctx.mark_non_differentiable(nll)
        return (1.0 - eps_ls) * nll + eps_ls * uniform, nll

    @staticmethod
    def backward(ctx, grad_smoothed: Tensor, grad_nll: Tensor):
        grad_h, grad_w = ctx.saved_tensors
        return ((grad_h * grad_smoothed).to(ctx.dtypes[0]),
                (grad_w * grad_smoothed).to(ctx.dtypes[1]), None, None, None, None)


def output_loss(hidden: Tensor, weight: Tensor, target: Tensor, eps_ls: float, pad_id: int,
                chunk_elements: int | None = None) -> tuple[Tensor, Tensor]:
    """``smoothed_loss`` of the logits ``hidden @ weight.T`` (the tied pre-softmax projection,
    hidden (.., d), weight (V, d)), computed in chunks of about ``chunk_elements`` logits over the
    real (non-pad) target positions only (``_OutputLoss``). The same loss and gradients to float
    rounding. Default chunks: 1024 positions on a CPU, 64M logits (at least 1024 positions) on a
    GPU. Fewer positions per chunk pay for adding each chunk's (V, d) weight gradient into the
    sum: at V 37000, d 512 (2 threads) 56 positions per chunk took 3.3 s against 1.8 unfused,
    1024 positions 1.79 s; at V 8000, d 128, 256 to 1024 positions all took 0.13-0.135 s against
    0.16 unfused.
    On the 2-core AMD EPYC, `cpu` base (vocabulary 8000, ~2000 target tokens per step; idle
    machine, ``python benchmarks/loss.py``): with 262 positions per chunk, the output layer's
    forward + backward 240 against 285 ms unfused at 1 thread, 139 against 157 at 2, a whole
    training step 1.00 against 1.06 s at 1 thread, 0.637 against 0.653 at 2; with 1024 (now the
    default) at 2 threads, 119 against 141 ms and a step 0.639 against 0.670 s."""
    if chunk_elements is None:
        rows = 1024 if hidden.device.type == "cpu" else max(1024, (1 << 26) // weight.shape[0])
    else:
        rows = max(1, chunk_elements // weight.shape[0])
    return _OutputLoss.apply(hidden, weight, target, eps_ls, pad_id, rows)
