"""Training cost two ways, reported side by side (Table 2's last columns).

1. The paper's method: training time x number of GPUs x sustained single-precision TFLOPS per GPU.
   It measures what the hardware could have done in that time, not what the model needed.
2. Counted from the architecture: the FLOPs of every matrix multiplication a training run performed,
   from the configuration and the (padded) batch shapes it saw.
"""

from __future__ import annotations

import functools
import re

from reproduce.config import ModelConfig

# The paper's own figures (section 6.1, footnote to Table 2): "sustained single-precision TFLOPS".
# They sit near the vendors' FP32 peaks (P100: 9.5, where NVIDIA's data sheets give 9.3 for PCIe and
# 10.6 for SXM2; K80: 2.8, one of the board's two GPUs at base clock).
PAPER_TFLOPS: dict[str, float] = {"K80": 2.8, "K40": 3.7, "M40": 6.0, "P100": 9.5}

# Our choice for GPUs the paper did not use: NVIDIA data-sheet FP32 PEAK at boost clock, without
# tensor cores or sparsity. These are peaks, not sustained rates, and a run in bf16 on tensor cores
# goes faster than them: they keep the paper's single-precision convention, they do not describe
# our run. A name with several words must all appear in the device's name (variants first).
VENDOR_PEAK_TFLOPS: dict[str, float] = {
    "V100": 15.7, "V100 PCIe": 14.0, "V100S": 16.4,  # V100 alone: SXM2
    "T4": 8.1,
    "A10": 31.2, "A30": 10.3, "A40": 37.4, "A100": 19.5, "A6000": 38.7,
    "RTX 3090": 35.6, "RTX 4090": 82.6, "RTX 6000 Ada": 91.1,
    "L4": 30.3, "L40": 90.5, "L40S": 91.6,
    "H100": 67.0, "H100 PCIe": 51.0, "H100 NVL": 60.0,  # H100 alone: SXM5
    "H200": 67.0, "H200 NVL": 60.0, "GH200": 67.0,  # H200 alone: SXM
}

# One table for lookups; the paper's figures win where both would name a GPU.
SUSTAINED_TFLOPS: dict[str, float] = {**VENDOR_PEAK_TFLOPS, **PAPER_TFLOPS}


def _words(name: str) -> set[str]:
    return set(re.findall(r"[A-Z0-9]+", name.upper()))


# Dense bf16 tensor-core peaks (no sparsity), NVIDIA data sheets, for MFU (`bench --gpu`).
BF16_DENSE_TFLOPS: dict[str, float] = {
    "A10": 125.0, "A30": 165.0, "A40": 149.7, "A100": 312.0, "A6000": 154.8,
    "L4": 121.0, "L40": 181.0, "L40S": 362.0, "RTX 4090": 165.2,
    "H100": 989.0, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H200": 989.0, "GH200": 989.0,
}


# Memory bandwidth (TB/s) and memory (GB) per GPU, NVIDIA data sheets: what prices a GPU never
# measured from one that was (``plan.gpu_prices``). "A100" alone is the 40 GB part; "A100 80GB"
# the other (its name says so).
MEMORY_TBS: dict[str, float] = {
    "K80": 0.24, "K40": 0.288, "M40": 0.288, "P100": 0.732, "T4": 0.32,
    "V100": 0.9, "V100 PCIe": 0.9, "V100S": 1.134,
    "A10": 0.6, "A30": 0.933, "A40": 0.696, "A100": 1.555, "A100 80GB": 2.039, "A6000": 0.768,
    "RTX 3090": 0.936, "RTX 4090": 1.008, "RTX 6000 Ada": 0.96,
    "L4": 0.3, "L40": 0.864, "L40S": 0.864,
    "H100": 3.35, "H100 PCIe": 2.0, "H100 NVL": 3.9, "H200": 4.8, "H200 NVL": 4.8, "GH200": 4.0,
}
MEMORY_GB: dict[str, float] = {
    "K80": 12, "K40": 12, "M40": 12, "P100": 16, "T4": 16, "V100": 16, "V100 PCIe": 16,
    "V100S": 32, "A10": 24, "A30": 24, "A40": 48, "A100": 40, "A100 80GB": 80, "A6000": 48,
    "RTX 3090": 24, "RTX 4090": 24, "RTX 6000 Ada": 48, "L4": 24, "L40": 48, "L40S": 48,
    "H100": 80, "H100 PCIe": 80, "H100 NVL": 94, "H200": 141, "H200 NVL": 141, "GH200": 96,
}


def lookup(name: str, table: dict[str, float]) -> float | None:
    """The entry of ``table`` for a device name such as "NVIDIA H100 80GB HBM3"; None when none
    matches. Whole words only, so "A10G" is not an "A10"; the entry with most words wins, so
    "NVIDIA H100 PCIe" is the PCIe part, not the SXM one."""
    words = _words(name)
    matches = [key for key in table if _words(key) <= words]
    if not matches:
        return None
    return table[max(matches, key=lambda key: len(_words(key)))]


def gpu_tflops(name: str) -> float | None:
    """Sustained fp32 TFLOPS (the paper's method) for a device name such as "Tesla V100-SXM2-16GB";
    None when no entry matches (``lookup``)."""
    return lookup(name, SUSTAINED_TFLOPS)


def paper_cost(train_hours: float, n_gpus: int, tflops_per_gpu: float) -> float:
    """The paper's training cost in FLOPs: hours x 3600 x GPUs x TFLOPS x 1e12."""
    return train_hours * 3600 * n_gpus * tflops_per_gpu * 1e12


# --- Counted from the architecture ---------------------------------------------------------------
#
# Forward FLOPs are 2 x the multiply-adds of every matrix multiplication; training is 3 x forward,
# since the backward pass multiplies each matrix product twice (gradients for both operands). That
# holds here because every matmul's operands need gradients (the embedding is trained).
#
# Neglected, being O(tokens x d_model) or less against the matmuls' O(tokens x d_model x d_ff): bias
# additions, residual adds, layer norms, ReLU, dropout, the softmax and masking inside attention, the
# embedding lookup, its sqrt(d_model) scale and the positional encodings, the (label-smoothed) loss
# and its log-softmax over the vocabulary, and the optimizer's update (O(parameters) per step).
# Also outside the count: validation, beam search, and communication between devices.


def feed_forward_macs(c: ModelConfig) -> float:
    """Multiply-adds of the feed-forward per token: equation 2's two matmuls for ``relu``; for a
    part the formulas do not know (a module of one's own), torch's FlopCounterMode over one token
    through the part built on the meta device (no weights allocated), said by ``counted_how``."""
    if c.feed_forward == "relu":
        return 2 * c.d_model * c.d_ff
    return _counted_macs(c)


@functools.cache
def _counted_macs(c: ModelConfig) -> float:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from reproduce.paper import slots

    with torch.device("meta"):
        part = slots.build("feed_forward", c)
        x = torch.zeros(1, 1, c.d_model)
    with FlopCounterMode(display=False) as counter:
        part(x)
    return counter.get_total_flops() / 2


def counted_how(c: ModelConfig) -> str:
    """How a config's FLOPs were counted, where not by the paper's formulas alone ("" where so)."""
    if c.feed_forward == "relu":
        return ""
    return (f"the feed-forward {c.feed_forward!r} counted by torch's FlopCounterMode: "
            f"{_counted_macs(c):,.0f} multiply-adds a token")


def forward_flops_per_token(c: ModelConfig) -> tuple[float, float]:
    """Forward FLOPs of the position-wise matmuls, per source token and per target token.

    Source token, each encoder layer: Q, K (d_model x h*d_k), V (d_model x h*d_v), O (h*d_v x
    d_model) and the FFN (d_model x d_ff, d_ff x d_model); each decoder layer's cross-attention K and
    V are projections of the encoder's output, so they are per source token too.
    Target token, each decoder layer: self-attention Q, K, V, O, cross-attention Q and O, the FFN;
    once: the tied pre-softmax projection (d_model x vocab_size)."""
    qk, v = c.d_model * c.h * c.d_k, c.d_model * c.h * c.d_v  # multiply-adds of one projection
    ffn = feed_forward_macs(c)
    attention = 2 * qk + 2 * v  # Q, K, V and O (O is h*d_v x d_model: as many as V)
    source = c.N * (attention + ffn) + c.N * (qk + v)
    target = c.N * (attention + (qk + v) + ffn) + c.d_model * c.vocab_size
    return 2.0 * source, 2.0 * target


def attention_forward_flops(c: ModelConfig, src_sq: int, tgt_sq: int, cross: int) -> float:
    """Forward FLOPs of Q K^T (2 h d_k per query-key pair) and of the weighted sum of values
    (2 h d_v per pair), over all layers. The pair counts are padded and, for the decoder's
    self-attention, the full T x T square: sum of B*S*S (`src_sq`), B*T*T (`tgt_sq`), B*T*S (`cross`)
    over batches, as the fused kernel computes them."""
    per_pair = 2 * c.h * (c.d_k + c.d_v)
    return float(per_pair * c.N * (src_sq + tgt_sq + cross))


def analytic_flops(model_config: ModelConfig, src_tokens: int, tgt_tokens: int, src_sq: int,
                   tgt_sq: int, cross: int) -> float:
    """Training FLOPs (3 x forward) of the batches summarized by these sums over all batches:
    `src_tokens` = B*S, `tgt_tokens` = B*T (padded, as computed), `src_sq` = B*S*S, `tgt_sq` = B*T*T,
    `cross` = B*T*S."""
    per_source, per_target = forward_flops_per_token(model_config)
    forward = (per_source * src_tokens + per_target * tgt_tokens
               + attention_forward_flops(model_config, src_sq, tgt_sq, cross))
    return 3.0 * forward
