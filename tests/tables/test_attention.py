"""Attention maps (Figures 3-5): weights recomputed from each module's inputs."""

from pathlib import Path

import pytest
import torch

from reproduce.config import ModelConfig
from reproduce.errors import DataError
from reproduce.paper.model import Transformer
from reproduce.tables.attention_maps import attention_weights, plot_attention

ROOT = Path(__file__).resolve().parents[2]


def test_weights_are_distributions_that_respect_masks_and_reproduce_the_output(tmp_path):
    torch.manual_seed(0)
    c = ModelConfig(N=2, d_model=32, d_ff=64, h=4, d_k=8, d_v=8, vocab_size=50, p_drop=0.0)
    model = Transformer(c).eval()
    src = torch.tensor([[5, 6, 7, 8, 2, 0, 0]])  # two pads at the end
    tgt = torch.tensor([[1, 9, 10, 11]])
    w = attention_weights(model, src, tgt)
    assert [len(w[k]) for k in ("encoder self", "decoder self", "decoder cross")] == [2, 2, 2]
    enc, dec, cross = w["encoder self"][0], w["decoder self"][1], w["decoder cross"][0]
    assert enc.shape == (4, 7, 7) and dec.shape == (4, 4, 4) and cross.shape == (4, 4, 7)
    for t in (enc, dec, cross):
        torch.testing.assert_close(t.sum(-1), torch.ones(t.shape[:-1]))
    assert enc[..., 5:].abs().max() == 0 and cross[..., 5:].abs().max() == 0  # no weight on pads
    assert torch.triu(dec, diagonal=1).abs().max() == 0  # no weight on the future
    # The recomputed weights give the fused kernel's output: encoder layer 0's attention.
    layer = model.encoder[0].self_attn
    x = model._embed(src, model.src_pos)
    _, v = layer.project_kv(x)
    by_hand = layer.w_o((enc @ v[0]).transpose(0, 1).reshape(1, 7, -1))
    torch.testing.assert_close(by_hand, layer(x, x, model.src_mask(src)), atol=1e-5, rtol=1e-5)
    path = plot_attention([("enc", enc, list("abcdefg"), list("abcdefg"))], tmp_path / "a.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_a_committed_run_without_its_checkpoints_says_why_and_how_in_one_line(tmp_path,
                                                                              monkeypatch):
    """A fresh clone holds records, not checkpoints: `attention --run` on one of ours names the
    record, says checkpoints are not committed, and gives the commands that make them."""
    from reproduce.__main__ import main
    from reproduce.tables.attention_maps import draw

    with pytest.raises(DataError) as raised:
        draw("table3-base-cpu-seed0", None, None, ROOT / "results", tmp_path / "runs")
    said = str(raised.value)
    assert "\n" not in said and "its record is here" in said and "checkpoints are not" in said
    assert said.endswith("python -m reproduce table3 --variant base --scale cpu --seeds 0 "
                         "--results mine && python -m reproduce attention --run "
                         "table3-base-cpu-seed0 --results mine")
    for name in ("REPRODUCE_RESULTS", "REPRODUCE_RUNS"):  # --results sets them: undone after
        monkeypatch.setenv(name, str(tmp_path / name))
    assert main(["attention", "--run", "nothing-like-it", "--results", str(tmp_path)]) == 2
