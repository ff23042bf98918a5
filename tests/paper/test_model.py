"""The model against the paper's definitions and torch's reference layers."""

import dataclasses
import math

import pytest
import torch
from torch import nn

from reproduce.config import ModelConfig
from reproduce.errors import ConfigError
from reproduce.paper.model import (
    DecoderLayer,
    EncoderLayer,
    MultiHeadAttention,
    Transformer,
    build_on_meta,
    count_parameters,
    sinusoid_table,
)

SMALL = ModelConfig(vocab_size=50, N=2, d_model=16, d_ff=32, h=4, d_k=4, d_v=4, p_drop=0.0)


def model(config: ModelConfig = SMALL, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(config).double().eval()


def tokens(B: int, L: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, SMALL.vocab_size, (B, L), generator=g)


def test_shapes_when_h_times_dk_differs_from_d_model():
    c = ModelConfig(vocab_size=50, N=1, d_model=16, d_ff=32, h=3, d_k=7, d_v=5, p_drop=0.0)
    m = model(c)
    attn = m.encoder[0].self_attn
    assert attn.w_q.weight.shape == (3 * 7, 16)
    assert attn.w_v.weight.shape == (3 * 5, 16)
    assert attn.w_o.weight.shape == (16, 3 * 5)
    assert m(tokens(2, 5), tokens(2, 6)).shape == (2, 6, 50)


@pytest.mark.parametrize("d_v", [4, 6])
def test_fused_projections_compute_the_same_in_fewer_matmuls(d_v):
    """``features(fused=True)`` (the fast path's): the same outputs and weight gradients as the
    projections one by one (fp64: equal to rounding), with each self-attention's Q, K and V one
    matmul and the source's keys and values of all N decoder layers one: 10N + 1 matmuls forward
    instead of 16N (N=2 here: 21 instead of 32; W_O's and the FFN's counted in both)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Matmuls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func in (torch.ops.aten.addmm.default, torch.ops.aten.mm.default)
            return func(*args, **(kwargs or {}))

    c = dataclasses.replace(SMALL, d_v=d_v)
    src, tgt = tokens(3, 5), tokens(3, 6)
    src[0, 3:] = c.pad_id
    outputs, grads, matmuls = [], [], []
    for fused in (False, True):
        m = model(c)
        with Matmuls() as counted:
            out = m.features(src, tgt, fused=fused)
        out.pow(2).sum().backward()
        outputs.append(out)
        grads.append({n: p.grad for n, p in m.named_parameters() if p.grad is not None})
        matmuls.append(counted.count)
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-12, atol=1e-12)
    assert grads[1].keys() == grads[0].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-10, atol=1e-12)
    N = c.N  # encoder: Q K V, W_O, 2 FFN; decoder: self Q K V, W_O, cross Q, K, V, W_O, 2 FFN
    assert matmuls == [N * 6 + N * 10, N * 4 + N * 6 + 1]


def test_causal_mask_blocks_the_future():
    m, src, tgt = model(), tokens(2, 5), tokens(2, 7)
    changed = tgt.clone()
    changed[:, 4] = (changed[:, 4] + 1 - 4) % (SMALL.vocab_size - 4) + 4
    a, b = m(src, tgt), m(src, changed)
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_source_padding_changes_nothing():
    m, src, tgt = model(), tokens(2, 5), tokens(2, 6)
    padded = torch.cat([src, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    torch.testing.assert_close(m(src, tgt), m(padded, tgt))


def test_target_padding_changes_nothing_before_it():
    m, src, tgt = model(), tokens(2, 5), tokens(2, 6)
    padded = torch.cat([tgt, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    torch.testing.assert_close(m(src, tgt), m(src, padded)[:, :6])


def test_sinusoid_formula():
    d_model, table = 16, sinusoid_table(50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_embeddings_are_tied_and_scaled():
    m = model()
    assert m.embed.weight.data_ptr() == m.embed.weight.data_ptr()
    hidden = torch.randn(1, 1, SMALL.d_model, dtype=torch.double)
    torch.testing.assert_close(m.logits(hidden), hidden @ m.embed.weight.t())
    x = m._embed(torch.tensor([[5]]), m.src_pos)
    expected = m.embed.weight[5] * math.sqrt(SMALL.d_model) + sinusoid_table(1, 16)[0].double()
    torch.testing.assert_close(x[0, 0], expected)


def test_learned_positions_are_parameters():
    c = ModelConfig(**{**SMALL.__dict__, "positions": "learned", "max_positions": 20})
    m = model(c)
    assert count_parameters(m) == count_parameters(model()) + 2 * 20 * 16
    with pytest.raises(ValueError, match="max_positions"):
        m(tokens(1, 21), tokens(1, 3))


def test_a_learned_table_started_at_the_sinusoid_is_the_sinusoidal_model_at_step_0():
    """``positions_init``: "sinusoid" starts the learned tables at the sinusoid, so with the
    other weights copied the two models' outputs are equal; "sinusoid-rms" starts them as loud
    as the sinusoid (RMS 1/sqrt(2)), and "xavier" (the default) draws what it always drew."""
    learned = ModelConfig(**{**SMALL.__dict__, "positions": "learned", "max_positions": 64})
    sinusoidal = model()
    started = model(dataclasses.replace(learned, positions_init="sinusoid"))
    missing, unexpected = started.load_state_dict(sinusoidal.state_dict(), strict=False)
    assert sorted(missing) == ["src_pos.table.weight", "tgt_pos.table.weight"] and not unexpected
    src, tgt = tokens(3, 9), tokens(3, 7, seed=2)
    torch.testing.assert_close(started(src, tgt), sinusoidal(src, tgt), rtol=0, atol=1e-12)
    xavier = model(learned).src_pos.table.weight  # not the sinusoid: the output differs
    assert not torch.allclose(xavier, started.src_pos.table.weight.to(xavier.dtype), atol=1e-3)
    rms = model(dataclasses.replace(learned, positions_init="sinusoid-rms")).tgt_pos.table.weight
    sine = sinusoid_table(64, 16).double()
    assert abs(rms.pow(2).mean().sqrt() - sine.pow(2).mean().sqrt()) < 0.05
    assert xavier.pow(2).mean().sqrt() < 0.35  # Xavier: far quieter than the sinusoid's 0.71
    with pytest.raises(ConfigError, match="positions_init.*only a learned position table"):
        ModelConfig(positions_init="sinusoid")
    with pytest.raises(ConfigError, match="allowed values are xavier, sinusoid, sinusoid-rms"):
        dataclasses.replace(learned, positions_init="zeros")


def _copy_attention(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    theirs.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
    theirs.out_proj.weight.copy_(ours.w_o.weight)
    theirs.out_proj.bias.copy_(ours.w_o.bias)


def _copy_common(ours: nn.Module, theirs: nn.Module, norms: int) -> None:
    theirs.linear1.weight.copy_(ours.ffn.w_1.weight)
    theirs.linear1.bias.copy_(ours.ffn.w_1.bias)
    theirs.linear2.weight.copy_(ours.ffn.w_2.weight)
    theirs.linear2.bias.copy_(ours.ffn.w_2.bias)
    for i in range(1, norms + 1):
        getattr(theirs, f"norm{i}").load_state_dict(getattr(ours, f"norm_{i}").state_dict())


def _randomize(module: nn.Module) -> None:
    torch.manual_seed(3)
    for p in module.parameters():
        nn.init.normal_(p, std=0.3)


@torch.no_grad()
def test_encoder_layer_matches_torch():
    ours = EncoderLayer(SMALL).double().eval()
    _randomize(ours)
    theirs = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True,
                                        norm_first=False).double().eval()
    _copy_attention(ours.self_attn, theirs.self_attn)
    _copy_common(ours, theirs, norms=2)
    x = torch.randn(3, 7, 16, dtype=torch.double)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[0, 5:] = True
    out = ours(x, (~pad)[:, None, None, :])
    ref = theirs(x, src_key_padding_mask=pad)
    torch.testing.assert_close(out[~pad], ref[~pad])


@torch.no_grad()
def test_decoder_layer_matches_torch():
    ours = DecoderLayer(SMALL).double().eval()
    _randomize(ours)
    theirs = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True,
                                        norm_first=False).double().eval()
    _copy_attention(ours.self_attn, theirs.self_attn)
    _copy_attention(ours.cross_attn, theirs.multihead_attn)
    _copy_common(ours, theirs, norms=3)
    y, memory = torch.randn(3, 6, 16, dtype=torch.double), torch.randn(3, 7, 16, dtype=torch.double)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 4:] = True
    causal = nn.Transformer.generate_square_subsequent_mask(6, dtype=torch.double)
    out = ours(y, memory, (~pad)[:, None, None, :])
    ref = theirs(y, memory, tgt_mask=causal, memory_key_padding_mask=pad)
    torch.testing.assert_close(out, ref)


@torch.no_grad()
def test_pre_norm_is_torch_s_norm_first_transformer_with_its_final_norms():
    """``model.wiring: pre-norm`` (a LayerNorm before each sublayer, one closing each stack, as
    fairseq's --encoder-normalize-before): the whole encoder-decoder against
    ``nn.Transformer(norm_first=True)``, whose stacks end in their own norms, weights copied."""
    c = dataclasses.replace(SMALL, wiring="pre-norm")
    ours = Transformer(c).double().eval()
    _randomize(ours)
    theirs = nn.Transformer(16, 4, 2, 2, 32, dropout=0.0, batch_first=True,
                            norm_first=True).double().eval()
    for mine, their in zip(ours.encoder, theirs.encoder.layers, strict=True):
        _copy_attention(mine.self_attn, their.self_attn)
        _copy_common(mine, their, norms=2)
    for mine, their in zip(ours.decoder, theirs.decoder.layers, strict=True):
        _copy_attention(mine.self_attn, their.self_attn)
        _copy_attention(mine.cross_attn, their.multihead_attn)
        _copy_common(mine, their, norms=3)
    theirs.encoder.norm.load_state_dict(ours.encoder_norm.state_dict())
    theirs.decoder.norm.load_state_dict(ours.decoder_norm.state_dict())
    src = torch.randint(1, 50, (3, 7))
    src[0, 5:] = 0
    tgt = torch.randint(1, 50, (3, 6))
    memory, mask = ours.encode(src)
    out = ours.decode(tgt, memory, mask)
    pad = src == 0
    causal = nn.Transformer.generate_square_subsequent_mask(6, dtype=torch.double)
    ref = theirs(ours._embed(src, ours.src_pos), ours._embed(tgt, ours.tgt_pos), tgt_mask=causal,
                 src_key_padding_mask=pad, memory_key_padding_mask=pad)
    torch.testing.assert_close(out, ref)
    # post-norm has no final norms: the committed checkpoints' parameters are unchanged
    assert count_parameters(ours) - count_parameters(Transformer(SMALL)) == 2 * 2 * 16


def independent_count(c: ModelConfig) -> int:
    """Parameter count from the paper's formulas, written without looking at the modules."""
    d, V = c.d_model, c.vocab_size
    attention = d * c.h * c.d_k * 2 + c.h * c.d_k * 2 + d * c.h * c.d_v + c.h * c.d_v \
        + c.h * c.d_v * d + d
    ffn = d * c.d_ff + c.d_ff + c.d_ff * d + d
    norm = 2 * d
    encoder = c.N * (attention + ffn + 2 * norm)
    decoder = c.N * (2 * attention + ffn + 3 * norm)
    positions = 2 * c.max_positions * d if c.positions == "learned" else 0
    return V * d + encoder + decoder + positions


@pytest.mark.parametrize("overrides", [
    {}, {"h": 1, "d_k": 512, "d_v": 512}, {"d_k": 16}, {"N": 2}, {"d_model": 1024, "d_k": 128},
    {"positions": "learned"}, {"d_model": 1024, "d_ff": 4096, "h": 16},
])
def test_parameter_count_matches_independent_count(overrides):
    c = ModelConfig(**overrides)
    assert count_parameters(build_on_meta(c)) == independent_count(c)


def test_meta_build_allocates_nothing():
    m = build_on_meta(ModelConfig(d_model=1024, d_ff=4096, h=16))
    assert all(p.is_meta for p in m.parameters())


def test_depth_scaled_init_shrinks_only_the_residual_branch_outputs():
    c = ModelConfig(vocab_size=50, N=3, d_model=16, d_ff=32, h=2, d_k=8, d_v=8)
    torch.manual_seed(0)
    plain = dict(Transformer(c).named_parameters())
    torch.manual_seed(0)
    scaled = dict(Transformer(dataclasses.replace(c, init="depth-scaled")).named_parameters())
    gains = {"encoder": (2 * 3) ** -0.5, "decoder": (3 * 3) ** -0.5}
    shrunk = 0
    for name, p in plain.items():
        if name.endswith(("w_o.weight", "w_2.weight")):
            torch.testing.assert_close(scaled[name], p * gains[name.split(".")[0]])
            shrunk += 1
        else:
            assert torch.equal(scaled[name], p), name
    assert shrunk == 3 * 2 + 3 * 3  # encoder: self-attn, FFN; decoder: self, cross, FFN
