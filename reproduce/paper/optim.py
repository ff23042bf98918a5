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


def _minus_q_(probs: Tensor, target: Tensor, eps_ls: float) -> Tensor:
    """The smoothed loss's gradient with respect to the logits, softmax - q (q: 1 - eps_ls on the
    target, eps_ls / V everywhere), written over the softmax ``probs`` (.., V) in place."""
    index = target.unsqueeze(-1)
    return probs.sub_(eps_ls / probs.shape[-1]).scatter_add_(
        -1, index, torch.full(index.shape, eps_ls - 1.0, dtype=probs.dtype, device=probs.device))


def _precisions(hidden: Tensor) -> tuple[str, torch.dtype, torch.dtype]:
    """The output loss's device type, its matmuls' dtype (autocast's when it is on, as autograd's
    would be) and its sums' (fp32, or fp64 for fp64 inputs)."""
    device = hidden.device.type
    dtype = (torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device)
             else hidden.dtype)
    return device, dtype, torch.float64 if hidden.dtype == torch.float64 else torch.float32


def _scaled_grads(ctx, grad_smoothed: Tensor) -> tuple[Tensor, Tensor]:
    """The hidden states' and weight's gradients the forward pass saved, scaled by the incoming
    gradient, in the inputs' dtypes: the backward of both output losses."""
    grad_h, grad_w = ctx.saved_tensors
    return ((grad_h * grad_smoothed).to(ctx.dtypes[0]),
            (grad_w * grad_smoothed).to(ctx.dtypes[1]))


class _OutputLoss(torch.autograd.Function):
    """``output_loss``'s forward and backward: the smoothed loss of ``hidden @ weight.T`` without
    the (tokens, V) logits in memory: the
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
        device, dtype, acc = _precisions(hidden)
        grads = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        vocab = weight.shape[0]
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
                if grad_h is not None and grad_w is not None:  # grads
                    g = _minus_q_(logp.exp_(), tc, eps_ls).to(dtype)
                    grad_h[start:start + rows] = g @ w
                    grad_w += (g.t() @ hc).to(acc)
        if grad_h is not None:  # grads
            full = torch.zeros_like(hidden, dtype=acc)
            full[keep] = grad_h
            ctx.save_for_backward(full, grad_w)
            ctx.dtypes = hidden.dtype, weight.dtype
        ctx.mark_non_differentiable(nll)
        return (1.0 - eps_ls) * nll + eps_ls * uniform, nll

    @staticmethod
    def backward(ctx, grad_smoothed: Tensor, grad_nll: Tensor):
        return (*_scaled_grads(ctx, grad_smoothed), None, None, None, None)


def _rows(hidden: Tensor, weight: Tensor, chunk_elements: int | None) -> int:
    """Positions per chunk of the output loss: about ``chunk_elements`` logits; by default 1024
    positions on a CPU, 64M logits (at least 1024 positions) on a GPU."""
    if chunk_elements is None:
        return 1024 if hidden.device.type == "cpu" else max(1024, (1 << 26) // weight.shape[0])
    return max(1, chunk_elements // weight.shape[0])


@torch.compiler.disable  # see the last paragraph below
def output_loss(hidden: Tensor, weight: Tensor, target: Tensor, eps_ls: float, pad_id: int,
                chunk_elements: int | None = None) -> tuple[Tensor, Tensor]:
    """Label-smoothed cross-entropy of the logits ``hidden @ weight.T`` (the tied pre-softmax
    projection, hidden (.., d), weight (V, d)) summed over non-pad target tokens, and the plain NLL
    sum. Smoothing spreads eps_ls uniformly over the vocabulary (Szegedy et al. 2016, as the
    paper's section 5.4; the same loss as ``F.cross_entropy(label_smoothing=eps_ls)``); the NLL has
    no gradient: it is for logging and perplexity. Divide by the token count for means.

    Computed in chunks of about ``chunk_elements`` logits over the real target positions only
    (``_OutputLoss``), so the (tokens, V) logits are never in memory whole. Default chunks: 1024
    positions on a CPU, 64M logits (at least 1024 positions) on a GPU; fewer positions per chunk
    pay for adding each chunk's (V, d) weight gradient into the sum (docs/performance.md).

    ``torch.compile`` leaves it out (a graph break): the real positions' count and so the chunks'
    loop change with every batch, and traced they made dynamo recompile each new batch until its
    limit (a paper-scale CLI run on an H200 logged one step in 200 s, 2026-11-27). The fast path
    (``train.compile``) trains with ``padded_output_loss``, which it traces whole; evaluation
    keeps this one."""
    return _OutputLoss.apply(hidden, weight, target, eps_ls, pad_id,
                             _rows(hidden, weight, chunk_elements))


class _PaddedOutputLoss(torch.autograd.Function):
    """``padded_output_loss``'s forward and backward: ``_OutputLoss`` over every target position,
    padding included with weight 0, in chunks of a fixed ``rows``: no boolean indexing, so the
    chunks and every tensor's shape follow the batch's shape alone (nothing is read back to the
    host, and ``torch.compile`` traces it whole). The gradients are taken in the forward pass, as
    ``_OutputLoss``'s; a padding position's are zero."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, target: Tensor, eps_ls: float, pad_id: int,
                rows: int, chunks: int):
        shape = hidden.shape
        h, t = hidden.reshape(-1, shape[-1]), target.reshape(-1)  # (n, d), (n,)
        real = (t != pad_id)
        device, dtype, acc = _precisions(hidden)
        vocab = weight.shape[0]
        with torch.autocast(device, enabled=False):
            w = weight.to(dtype)
            nll = torch.zeros((), dtype=acc, device=hidden.device)
            uniform = torch.zeros((), dtype=acc, device=hidden.device)
            grad_h = torch.empty_like(h, dtype=acc)
            grad_w = torch.zeros_like(weight, dtype=acc)
            # compiled with dynamic shapes, a loop over the positions' count would be traced
            # again for every count: there, `chunks` chunks of a size that follows the count
            n = h.shape[0]
            for start, end in ([(i * n // chunks, (i + 1) * n // chunks) for i in range(chunks)]
                               if chunks else [(i, i + rows) for i in range(0, n, rows)]):
                hc, tc = h[start:end].to(dtype), t[start:end]
                keep = real[start:end]
                logp = F.log_softmax((hc @ w.t()).to(acc), dim=-1)  # (rows, V)
                # where, not a product: whatever a padding position holds is dropped
                nll -= torch.where(keep, logp.gather(-1, tc[:, None]).squeeze(-1), 0).sum()
                uniform -= torch.where(keep, logp.sum(-1), 0).sum() / vocab
                g = torch.where(keep[:, None], _minus_q_(logp.exp_(), tc, eps_ls), 0).to(dtype)
                grad_h[start:end] = g @ w
                grad_w += (g.t() @ hc).to(acc)
        ctx.save_for_backward(grad_h.view(shape), grad_w)
        ctx.dtypes = hidden.dtype, weight.dtype
        ctx.mark_non_differentiable(nll)
        return (1.0 - eps_ls) * nll + eps_ls * uniform, nll

    @staticmethod
    def backward(ctx, grad_smoothed: Tensor, grad_nll: Tensor):
        return (*_scaled_grads(ctx, grad_smoothed), None, None, None, None, None)


def padded_output_loss(hidden: Tensor, weight: Tensor, target: Tensor, eps_ls: float,
                       pad_id: int, chunk_elements: int | None = None, most_positions: int = 0
                       ) -> tuple[Tensor, Tensor, Tensor]:
    """``output_loss`` for the fast path (``train.compile``): the same smoothed loss and NLL sums,
    and the count of real target tokens, as tensors, computed over every target position with the
    padding weighted 0 (``_PaddedOutputLoss``): what it costs, nothing to read back, the
    same chunks for every batch of a shape. ``torch.compile(fullgraph=True)`` traces it whole
    once for any batch shape: there the chunks are as many as ``most_positions`` (the most
    target positions a batch holds; 0: one chunk) needs at the chunk size, each of a size that
    follows the batch's. The sums match ``output_loss``'s up to the order of additions."""
    rows = _rows(hidden, weight, chunk_elements)
    chunks = max(1, -(-most_positions // rows)) if torch.compiler.is_compiling() else 0
    smoothed, nll = _PaddedOutputLoss.apply(hidden, weight, target, eps_ls, pad_id, rows, chunks)
    return smoothed, nll, (target != pad_id).sum()
