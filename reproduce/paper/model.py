"""The Transformer of "Attention Is All You Need", section 3, in plain PyTorch.

No training machinery and no I/O here. Shapes: B batch, S source length, T target length,
h heads, d_k / d_v per-head sizes. Masks are boolean, True where attention is allowed.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from reproduce.config import ModelConfig
from reproduce.paper import slots
from reproduce.paper.slots import sinusoid_table  # noqa: F401 - the paper's 3.5, used from here

# --- 3.2 Attention -----------------------------------------------------------------------------


def fused_linear(x: Tensor, linears: list[nn.Linear]) -> list[Tensor]:
    """``[l(x) for l in linears]`` as one matmul: their weights and biases concatenated, the
    output split. The same sums as separate calls up to their order (low bits); one GEMM instead
    of ``len(linears)`` forward and two instead of ``2 * len(linears)`` backward, for the fast
    path (``train.compile``), where a GPU's step is bound by the host issuing kernels."""
    weight = torch.cat([linear.weight for linear in linears])
    bias = torch.cat([cast(Tensor, linear.bias) for linear in linears])
    return list(F.linear(x, weight, bias).split([linear.out_features for linear in linears], -1))


class MultiHeadAttention(nn.Module):
    """Section 3.2.2. Projections d_model -> h*d_k (Q, K), d_model -> h*d_v (V), h*d_v -> d_model.

    h*d_k need not equal d_model (Table 3 rows A, B, C). The attention itself is torch's fused
    ``scaled_dot_product_attention``: softmax(Q K^T / sqrt(d_k)) V (equation 1).
    """

    def __init__(self, d_model: int, h: int, d_k: int, d_v: int, p_attn: float = 0.0):
        super().__init__()
        self.h, self.d_k, self.d_v, self.p_attn = h, d_k, d_v, p_attn
        self.w_q = nn.Linear(d_model, h * d_k)
        self.w_k = nn.Linear(d_model, h * d_k)
        self.w_v = nn.Linear(d_model, h * d_v)
        self.w_o = nn.Linear(h * d_v, d_model)

    def _heads(self, x: Tensor, d: int) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.h, d).transpose(1, 2)  # (B, L, h*d) -> (B, h, L, d)

    def project_q(self, x: Tensor) -> Tensor:
        return self._heads(self.w_q(x), self.d_k)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.heads_kv(self.w_k(x), self.w_v(x))

    def heads_kv(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values projected elsewhere (``fused_linear``), split into heads."""
        return self._heads(k, self.d_k), self._heads(v, self.d_v)

    def self_attend(self, x: Tensor, mask: Tensor | None = None, is_causal: bool = False,
                    fused: bool = False) -> Tensor:
        """Self-attention of ``x``; ``fused``: its Q, K and V projections as one matmul."""
        if not fused:
            return self(x, x, mask, is_causal)
        q, k, v = fused_linear(x, [self.w_q, self.w_k, self.w_v])
        return self.attend(self._heads(q, self.d_k), *self.heads_kv(k, v), mask, is_causal)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
               is_causal: bool = False) -> Tensor:
        """Heads in (B, h, L, d), out (B, Lq, d_model)."""
        p = self.p_attn if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                             is_causal=is_causal)
        B, _, Lq, _ = out.shape
        return self.w_o(out.transpose(1, 2).reshape(B, Lq, self.h * self.d_v))  # concat heads

    def attend_beams(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, beam: int) -> Tensor:
        """One decoding step's queries q (B*beam, h, 1, d) against keys and values computed once
        per sentence (B, h, S, d): a sentence's beams are one block of `beam` queries, so the
        source is neither repeated nor attended per beam. Out (B*beam, 1, d_model)."""
        R = q.shape[0]
        q = q.view(R // beam, beam, self.h, self.d_k).transpose(1, 2)  # (B, h, beam, d_k)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, h, beam, d_v)
        return self.w_o(out.transpose(1, 2).reshape(R, 1, self.h * self.d_v))

    def forward(self, x_q: Tensor, x_kv: Tensor, mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        return self.attend(self.project_q(x_q), *self.project_kv(x_kv), mask, is_causal)


# --- 3.3 Position-wise feed-forward -------------------------------------------------------------


# The position-wise feed-forward network (3.3) is ``slots.PositionwiseFeedForward``, the
# ``model.feed_forward`` slot's ``relu``; where each LayerNorm sits is ``model.wiring`` (3.1).


# --- 3.5 Positional encoding --------------------------------------------------------------------


# The positional encodings (3.5) are ``slots.SinusoidalPositions`` and, for Table 3 row E,
# ``slots.LearnedPositions``: the ``model.positions`` slot's ``sinusoidal`` and ``learned``.


# --- 3.1 Encoder and decoder stacks -------------------------------------------------------------


class EncoderLayer(nn.Module):
    """Self-attention then FFN, each joined to the residual stream as ``model.wiring`` says: the
    paper's LayerNorm(x + Dropout(Sublayer(x))) (post-norm) by default (``slots``)."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(c.d_model, c.h, c.d_k, c.d_v, c.p_attn)
        self.ffn = slots.build("feed_forward", c)
        self.norm_1 = nn.LayerNorm(c.d_model)
        self.norm_2 = nn.LayerNorm(c.d_model)
        self.drop = nn.Dropout(c.p_drop)
        self.wiring = slots.build("wiring", c)

    def forward(self, x: Tensor, src_mask: Tensor, fused: bool = False) -> Tensor:
        w = self.wiring
        a = self.self_attn.self_attend(w.before(x, self.norm_1), src_mask, fused=fused)
        x = w.after(x, a, self.norm_1, self.drop)
        return w.after(x, self.ffn(w.before(x, self.norm_2)), self.norm_2, self.drop)


class LayerCache:
    """Keys and values one decoder layer has seen: past target positions, and the source's."""

    def __init__(self, self_k: Tensor, self_v: Tensor, cross_k: Tensor, cross_v: Tensor,
                 beam: int):
        self.self_k, self.self_v = self_k, self_v  # (B*beam, h, t, d): one more position per step
        self.cross_k, self.cross_v = cross_k, cross_v  # (B, h, S, d): once per sentence
        self.beam = beam

    @property
    def length(self) -> int:
        return self.self_k.shape[2]

    def append(self, k: Tensor, v: Tensor) -> None:
        self.self_k = torch.cat([self.self_k, k], dim=2)
        self.self_v = torch.cat([self.self_v, v], dim=2)

    def reorder(self, index: Tensor, sentences: Tensor | None = None) -> None:
        """Keep rows `index` (beam search moves hypotheses between beams). The source's keys and
        values are per sentence, and a row only ever moves within its own sentence's beams: they
        change only when sentences leave the search (`sentences`: those that stay)."""
        if sentences is not None:
            self.cross_k, self.cross_v = self.cross_k[sentences], self.cross_v[sentences]
        # Growing tensors, not a buffer preallocated to the longest output: a step copies the t
        # filled positions twice (here and in `append`), not the whole buffer once. 280 rows of
        # the `cpu` base, 35 steps, 1 thread: 0.13 against 0.52 s per layer (2-core EPYC).
        self.self_k = self.self_k.index_select(0, index)
        self.self_v = self.self_v.index_select(0, index)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, FFN; each joined to the residual stream
    as ``model.wiring`` says (post-norm by default)."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(c.d_model, c.h, c.d_k, c.d_v, c.p_attn)
        self.cross_attn = MultiHeadAttention(c.d_model, c.h, c.d_k, c.d_v, c.p_attn)
        self.ffn = slots.build("feed_forward", c)
        self.norm_1 = nn.LayerNorm(c.d_model)
        self.norm_2 = nn.LayerNorm(c.d_model)
        self.norm_3 = nn.LayerNorm(c.d_model)
        self.drop = nn.Dropout(c.p_drop)
        self.wiring = slots.build("wiring", c)

    def forward(self, y: Tensor, memory: Tensor, src_mask: Tensor,
                cache: LayerCache | None = None,
                cross_kv: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """``cross_kv``: the source's keys and values for the encoder-decoder attention, projected
        with every layer's at once (``Transformer.decode``, fused); then self-attention's Q, K and
        V are one matmul too."""
        w = self.wiring
        if cache is None:  # whole target at once; the causal mask hides the future
            h = w.before(y, self.norm_1)
            a = self.self_attn.self_attend(h, is_causal=True, fused=cross_kv is not None)
            y = w.after(y, a, self.norm_1, self.drop)
            h = w.before(y, self.norm_2)
            if cross_kv is None:
                c = self.cross_attn(h, memory, src_mask)
            else:
                q = self.cross_attn.project_q(h)
                c = self.cross_attn.attend(q, *self.cross_attn.heads_kv(*cross_kv), src_mask)
        else:  # one new position per call; earlier positions come from the cache
            h = w.before(y, self.norm_1)
            cache.append(*self.self_attn.project_kv(h))
            q = self.self_attn.project_q(h)
            a = self.self_attn.attend(q, cache.self_k, cache.self_v, is_causal=y.shape[1] > 1)
            y = w.after(y, a, self.norm_1, self.drop)
            q = self.cross_attn.project_q(w.before(y, self.norm_2))  # one row per sentence
            c = self.cross_attn.attend_beams(q, cache.cross_k, cache.cross_v, src_mask, cache.beam)
        y = w.after(y, c, self.norm_2, self.drop)
        return w.after(y, self.ffn(w.before(y, self.norm_3)), self.norm_3, self.drop)


class Transformer(nn.Module):
    """Encoder-decoder with one weight matrix shared by source embedding, target embedding and the
    pre-softmax projection (section 3.4); embeddings are multiplied by sqrt(d_model)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        c = self.config = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.src_pos: nn.Module = slots.build("positions", c)  # one table or encoding a stack
        self.tgt_pos: nn.Module = slots.build("positions", c)
        self.drop = nn.Dropout(c.p_drop)  # on the sums of embeddings and positions (5.4)
        self.encoder = nn.ModuleList(EncoderLayer(c) for _ in range(c.N))
        self.decoder = nn.ModuleList(DecoderLayer(c) for _ in range(c.N))
        # a LayerNorm closing each stack where the wiring asks for one (pre-norm)
        final = slots.build("wiring", c).final_norm
        self.encoder_norm = nn.LayerNorm(c.d_model) if final else nn.Identity()
        self.decoder_norm = nn.LayerNorm(c.d_model) if final else nn.Identity()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform matrices, zero biases, embedding N(0, d_model^-0.5) (the paper states no
        initialization). With ``init="depth-scaled"`` the output projection of every residual
        branch (W_O of each attention, W_2 of each FFN) is further multiplied by 1/sqrt(L), L the
        residual sublayers of its stack (2N in the encoder, 3N in the decoder), as GPT-2's scaled
        init: every LayerNorm(x + Sublayer(x)) then starts close to LayerNorm(x), and a deep
        post-norm stack passes its input and gradients through from the first step. Measured at
        the `cpu` scale (N=6, d_model 128): a copy task was learned in ~300 steps (with Xavier
        init still not after 300, nor after 550 with 8000 pieces), and Bible EN-DE dev PPL after
        300 steps was 415 instead of 613.
        """
        branch_gain = {"encoder": (2 * self.config.N) ** -0.5, "decoder": (3 * self.config.N) ** -0.5}
        for name, p in self.named_parameters():
            if name == "embed.weight":
                # Tied with the softmax: N(0, d_model^-0.5) keeps logits O(1) (tensor2tensor).
                nn.init.normal_(p, std=self.config.d_model ** -0.5)
            elif name.endswith("_pos.table.weight"):
                getattr(self, name.split(".", 1)[0]).reset_parameters()  # model.positions_init
            elif p.dim() > 1:
                nn.init.xavier_uniform_(p)
                if self.config.init == "depth-scaled" and name.endswith(("w_o.weight", "w_2.weight")):
                    with torch.no_grad():
                        p.mul_(branch_gain[name.split(".", 1)[0]])
            elif name.endswith("bias") and "norm" not in name:
                nn.init.zeros_(p)

    def _embed(self, tokens: Tensor, positions: nn.Module, offset: int = 0) -> Tensor:
        x = self.embed(tokens) * math.sqrt(self.config.d_model)
        return self.drop(x + positions(tokens.shape[1], offset).to(x.dtype))

    def src_mask(self, src: Tensor) -> Tensor:
        return (src != self.config.pad_id)[:, None, None, :]  # (B, S) -> (B, 1, 1, S)

    def encode(self, src: Tensor, fused: bool = False) -> tuple[Tensor, Tensor]:
        """src (B, S) token ids -> memory (B, S, d_model) and its padding mask (B, 1, 1, S);
        ``fused``: each self-attention's Q, K and V projections as one matmul."""
        mask = self.src_mask(src)
        x = self._embed(src, self.src_pos)
        for layer in self.encoder:
            x = layer(x, mask, fused)
        return self.encoder_norm(x), mask

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor,
               fused: bool = False) -> Tensor:
        """tgt_in (B, T) shifted right -> hidden states (B, T, d_model), no cache; ``fused``:
        the source's keys and values of every layer as one matmul, and each self-attention's
        Q, K and V as one."""
        y = self._embed(tgt_in, self.tgt_pos)
        layers = cast(list[DecoderLayer], list(self.decoder))
        cross: list[tuple[Tensor, Tensor] | None] = [None] * len(layers)
        if fused:
            kv = fused_linear(memory, [w for layer in layers
                                       for w in (layer.cross_attn.w_k, layer.cross_attn.w_v)])
            cross = list(zip(kv[0::2], kv[1::2], strict=True))
        for layer, cross_kv in zip(layers, cross, strict=True):
            y = layer(y, memory, src_mask, cross_kv=cross_kv)
        return self.decoder_norm(y)

    def logits(self, hidden: Tensor) -> Tensor:
        return hidden @ self.embed.weight.t()  # tied pre-softmax projection, (.., d) -> (.., V)

    def features(self, src: Tensor, tgt_in: Tensor, fused: bool = False) -> Tensor:
        """Teacher-forced decoder output (B, T, d_model), before the pre-softmax projection;
        ``fused``: projections that read the same input as one matmul (``fused_linear``)."""
        memory, mask = self.encode(src, fused)
        return self.decode(tgt_in, memory, mask, fused)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V)."""
        return self.logits(self.features(src, tgt_in))

    # --- incremental decoding (used by reproduce.paper.decoding) --------------------------------------

    def start_decoding(self, src: Tensor, beam: int = 1, use_cache: bool = True) -> DecoderState:
        """Encode once; the search has `beam` rows per sentence (rows b*beam .. +beam-1). With the
        cache, the source's keys and values are computed once per sentence (memory and mask keep
        one row per sentence); without it, memory and mask are repeated per row."""
        memory, mask = self.encode(src)
        if not use_cache:
            return DecoderState(memory.repeat_interleave(beam, dim=0),
                                mask.repeat_interleave(beam, dim=0), None)
        rows, c = memory.shape[0] * beam, self.config
        caches = [LayerCache(memory.new_empty(rows, c.h, 0, c.d_k),
                             memory.new_empty(rows, c.h, 0, c.d_v),
                             *cast(DecoderLayer, layer).cross_attn.project_kv(memory), beam)
                  for layer in self.decoder]
        return DecoderState(memory, mask, caches)

    def step(self, state: DecoderState, tokens: Tensor) -> Tensor:
        """Feed one token per row (B,), get next-token log-probabilities (B, V) in float32."""
        if state.caches is None:  # recompute the whole prefix (reference path)
            state.prefix = tokens[:, None] if state.prefix is None else torch.cat(
                [state.prefix, tokens[:, None]], dim=1)
            hidden = self.decode(state.prefix, state.memory, state.mask)[:, -1]
        else:
            t = state.caches[0].length
            y = self._embed(tokens[:, None], self.tgt_pos, offset=t)
            for layer, cache in zip(self.decoder, state.caches, strict=True):
                y = layer(y, state.memory, state.mask, cache)
            hidden = self.decoder_norm(y[:, -1])
        return F.log_softmax(self.logits(hidden).float(), dim=-1)


class DecoderState:
    """What a search carries between steps: encoder output, masks, prefix and per-layer caches."""

    def __init__(self, memory: Tensor, mask: Tensor, caches: list[LayerCache] | None):
        self.memory, self.mask, self.caches = memory, mask, caches
        self.prefix: Tensor | None = None  # tokens fed so far: only the path without caches

    def reorder(self, index: Tensor, sentences: Tensor | None = None) -> None:
        """Keep rows `index` of the previous step; with `sentences` (indices into the batch's
        sentences still searching), only those sentences' rows remain."""
        if self.caches is None:  # prefix, memory and mask per row
            assert self.prefix is not None  # set by the first step, before any reorder
            self.prefix = self.prefix[index]
            if sentences is not None:
                self.memory, self.mask = self.memory[index], self.mask[index]
            return
        if sentences is not None:  # memory, mask and the source's keys and values per sentence
            self.memory, self.mask = self.memory[sentences], self.mask[sentences]
        for cache in self.caches:
            cache.reorder(index, sentences)


def count_parameters(model: nn.Module) -> int:
    """Unique parameters (the tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters())


def build_on_meta(config: ModelConfig) -> Transformer:
    """Build a model without allocating its weights (for parameter counts at the paper's size)."""
    with torch.device("meta"):
        return Transformer(config)
