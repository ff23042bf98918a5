"""Our Transformer rebuilt from the parts a user would otherwise pick, for the benchmark
(``reproduce.speed``) and as independent checks of our model.

* ``TorchTransformer``: ``torch.nn.Transformer`` between our embedding (tied with the pre-softmax
  projection, scaled by sqrt(d_model)) and our sinusoidal positions. nn.Transformer adds a final
  LayerNorm after each stack, which the paper lacks; we build the stacks with ``norm=None`` (its
  documented option) so that the two models are the same function.
* Hugging Face ``transformers``' MarianMT, built from a ``MarianConfig`` of the same size (no
  download): post-norm layers, sinusoidal positions, scaled embeddings shared by encoder, decoder
  and softmax, like the paper. It needs ``h * d_k == d_model``, and its position table has sin and
  cos in two halves where the paper interleaves them, so ``copy_into_marian`` overwrites the table
  with ours. ``transformers`` is an optional extra (``pip install -e '.[bench]'``).

``copy_into_*`` load our weights, so outputs can be compared token for token.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from reproduce.config import ModelConfig
from reproduce.paper.model import Transformer, sinusoid_table


def trainable_parameters(model: nn.Module) -> int:
    """Parameters the optimizer updates (Marian's frozen position tables are not among them)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# The peers build the paper's parts only: another part (pre-norm, a feed-forward of one's own)
# would be timed against a peer that is not the same model
PAPER_PARTS = {"positions": "sinusoidal", "feed_forward": "relu", "wiring": "post-norm"}


def _same_width(c: ModelConfig, who: str) -> None:
    if c.h * c.d_k != c.d_model or c.h * c.d_v != c.d_model:
        raise ValueError(f"{who} needs h * d_k == h * d_v == d_model; got h={c.h}, d_k={c.d_k}, "
                         f"d_v={c.d_v}, d_model={c.d_model}")
    other = ", ".join(f"{k} {getattr(c, k)}" for k, v in PAPER_PARTS.items() if getattr(c, k) != v)
    if other:
        paper = ", ".join(f"{k} {v}" for k, v in PAPER_PARTS.items())
        raise ValueError(f"{who} builds the paper's parts ({paper}); got {other}")


# --- torch.nn.Transformer -------------------------------------------------------------------------


class TorchTransformer(nn.Module):
    """The paper's model from ``torch.nn.Transformer`` (post-norm, ReLU, dropout ``p_drop``)."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        _same_width(c, "torch.nn.Transformer")
        self.config = c
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.register_buffer("positions", sinusoid_table(c.max_positions, c.d_model),
                             persistent=False)
        self.drop = nn.Dropout(c.p_drop)
        enc = nn.TransformerEncoderLayer(c.d_model, c.h, c.d_ff, c.p_drop, batch_first=True)
        dec = nn.TransformerDecoderLayer(c.d_model, c.h, c.d_ff, c.p_drop, batch_first=True)
        self.core = nn.Transformer(
            c.d_model, c.h, custom_encoder=nn.TransformerEncoder(enc, c.N, norm=None,
                                                                 enable_nested_tensor=False),
            custom_decoder=nn.TransformerDecoder(dec, c.N, norm=None), batch_first=True)

    def _embed(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens) * math.sqrt(self.config.d_model)
        return self.drop(x + self.positions[:tokens.shape[1]])

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V)."""
        pad = src == self.config.pad_id  # (B, S), True where padding (torch's convention)
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1], device=src.device)
        hidden = self.core(self._embed(src), self._embed(tgt_in), tgt_mask=causal,
                           src_key_padding_mask=pad, memory_key_padding_mask=pad,
                           tgt_is_causal=True)
        return hidden @ self.embed.weight.t()


@torch.no_grad()
def copy_into_torch(ours: Transformer, theirs: TorchTransformer) -> None:
    """Load our weights into the nn.Transformer build."""
    theirs.embed.weight.copy_(ours.embed.weight)

    def attention(mine, mha: nn.MultiheadAttention) -> None:
        mha.in_proj_weight.copy_(torch.cat([mine.w_q.weight, mine.w_k.weight, mine.w_v.weight]))
        mha.in_proj_bias.copy_(torch.cat([mine.w_q.bias, mine.w_k.bias, mine.w_v.bias]))
        mha.out_proj.load_state_dict(mine.w_o.state_dict())

    for mine, layer in zip(ours.encoder, theirs.core.encoder.layers, strict=True):
        attention(mine.self_attn, layer.self_attn)
        layer.linear1.load_state_dict(mine.ffn.w_1.state_dict())
        layer.linear2.load_state_dict(mine.ffn.w_2.state_dict())
        layer.norm1.load_state_dict(mine.norm_1.state_dict())
        layer.norm2.load_state_dict(mine.norm_2.state_dict())
    for mine, layer in zip(ours.decoder, theirs.core.decoder.layers, strict=True):
        attention(mine.self_attn, layer.self_attn)
        attention(mine.cross_attn, layer.multihead_attn)
        layer.linear1.load_state_dict(mine.ffn.w_1.state_dict())
        layer.linear2.load_state_dict(mine.ffn.w_2.state_dict())
        for i in (1, 2, 3):
            getattr(layer, f"norm{i}").load_state_dict(getattr(mine, f"norm_{i}").state_dict())


# --- Hugging Face MarianMT ------------------------------------------------------------------------


def marian(c: ModelConfig, bos: int, eos: int):
    """An untrained ``MarianMTModel`` of our size (raises ImportError without ``transformers``)."""
    from transformers import MarianConfig, MarianMTModel

    _same_width(c, "MarianMT")
    config = MarianConfig(
        vocab_size=c.vocab_size, d_model=c.d_model, encoder_layers=c.N, decoder_layers=c.N,
        encoder_attention_heads=c.h, decoder_attention_heads=c.h, encoder_ffn_dim=c.d_ff,
        decoder_ffn_dim=c.d_ff, activation_function="relu", dropout=c.p_drop,
        attention_dropout=c.p_attn, activation_dropout=0.0, max_position_embeddings=c.max_positions,
        scale_embedding=True, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        pad_token_id=c.pad_id, eos_token_id=eos, bos_token_id=bos, decoder_start_token_id=bos,
        forced_eos_token_id=None)
    return MarianMTModel(config)


@torch.no_grad()
def copy_into_marian(ours: Transformer, theirs) -> None:
    """Load our weights (and our interleaved sinusoid table) into a ``marian`` model."""
    core = theirs.model
    core.shared.weight.copy_(ours.embed.weight)
    table = sinusoid_table(core.encoder.embed_positions.weight.shape[0], ours.config.d_model)
    core.encoder.embed_positions.weight.copy_(table)
    core.decoder.embed_positions.weight.copy_(table)

    def attention(mine, attn) -> None:
        for a, b in (("w_q", "q_proj"), ("w_k", "k_proj"), ("w_v", "v_proj"), ("w_o", "out_proj")):
            getattr(attn, b).load_state_dict(getattr(mine, a).state_dict())

    for mine, layer in zip(ours.encoder, core.encoder.layers, strict=True):
        attention(mine.self_attn, layer.self_attn)
        layer.self_attn_layer_norm.load_state_dict(mine.norm_1.state_dict())
        layer.fc1.load_state_dict(mine.ffn.w_1.state_dict())
        layer.fc2.load_state_dict(mine.ffn.w_2.state_dict())
        layer.final_layer_norm.load_state_dict(mine.norm_2.state_dict())
    for mine, layer in zip(ours.decoder, core.decoder.layers, strict=True):
        attention(mine.self_attn, layer.self_attn)
        attention(mine.cross_attn, layer.encoder_attn)
        layer.self_attn_layer_norm.load_state_dict(mine.norm_1.state_dict())
        layer.encoder_attn_layer_norm.load_state_dict(mine.norm_2.state_dict())
        layer.fc1.load_state_dict(mine.ffn.w_1.state_dict())
        layer.fc2.load_state_dict(mine.ffn.w_2.state_dict())
        layer.final_layer_norm.load_state_dict(mine.norm_3.state_dict())


def marian_logits(model, src: Tensor, tgt_in: Tensor, pad_id: int) -> Tensor:
    """Teacher-forced logits (B, T, V) of a ``marian`` model."""
    return model(input_ids=src, attention_mask=(src != pad_id).long(),
                 decoder_input_ids=tgt_in, use_cache=False).logits


def marian_generate_kwargs(src: Tensor, beam: int, alpha: float, max_len_offset: int, pad: int,
                           bos: int, eos: int) -> dict[str, Any]:
    """``generate`` settings that match our search as far as ``transformers`` allows.

    Same: beam width, stop a sentence once `beam` hypotheses ended (``early_stopping=True``), PAD
    and BOS never emitted, EOS forced after (longest input + max_len_offset) tokens.
    Different: HF divides a finished hypothesis' log-probability by |Y|^alpha, we by GNMT's
    ((5 + |Y|) / 6)^alpha (|Y| counts EOS in both), so beam outputs may differ for alpha > 0 (at
    alpha = 0 both rank by the plain sum); and HF's length limit is per batch, ours per sentence
    (the same when a batch's sources have equal lengths)."""
    longest = int((src != pad).sum(dim=1).max())
    kwargs = dict(num_beams=beam, do_sample=False, max_new_tokens=longest + max_len_offset + 1,
                  forced_eos_token_id=eos, suppress_tokens=[pad, bos], decoder_start_token_id=bos,
                  eos_token_id=eos, pad_token_id=pad, num_return_sequences=1)
    if beam > 1:  # HF warns about beam-only settings in greedy search
        kwargs.update(length_penalty=alpha, early_stopping=True)
    return kwargs


@torch.no_grad()
def marian_generate(model, src: Tensor, beam: int, alpha: float, max_len_offset: int, pad: int,
                    bos: int, eos: int) -> list[list[int]]:
    """HF ``generate`` on a batch of sources; token ids without BOS/EOS, like ``beam_search``."""
    out = model.generate(input_ids=src, attention_mask=(src != pad).long(),
                         **marian_generate_kwargs(src, beam, alpha, max_len_offset, pad, bos, eos))
    rows = []
    for row in out[:, 1:].tolist():  # drop the decoder start token
        rows.append(row[:row.index(eos)] if eos in row else row)
    return rows


def smoothed_cross_entropy(logits: Tensor, target: Tensor, eps_ls: float, pad_id: int) -> Tensor:
    """The label-smoothed loss a user would write, summed over non-pad tokens: the same formula as
    ``reproduce.paper.optim.output_loss`` computes in chunks."""
    return F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), ignore_index=pad_id,
                           label_smoothing=eps_ls, reduction="sum")


def peer_step_loss(model: TorchTransformer, batch: dict[str, Tensor], eps_ls: float,
                   pad_id: int) -> Tensor:
    """A batch's smoothed loss sum as a user of ``nn.Transformer`` computes it (the logits, then
    ``F.cross_entropy(label_smoothing=...)``): ``step_time.step_loss``'s signature, for timing
    the peer's steps beside ours (``speed.gpu``)."""
    return smoothed_cross_entropy(model(batch["src"], batch["tgt_in"]), batch["tgt_out"], eps_ls,
                                  pad_id)
