"""The training pieces: the paper's schedule and label-smoothed loss."""

import pytest
import torch
import torch.nn.functional as F

from reproduce.config import BASE, TrainConfig
from reproduce.paper.optim import adam_with_schedule, lrate, output_loss
from tests.helpers import smoothed_loss


def test_lrate_is_equation_3():
    d, w = 512, 4000
    assert lrate(1, d, w) == pytest.approx(512 ** -0.5 * 1 * 4000 ** -1.5)
    assert lrate(w, d, w) == pytest.approx(512 ** -0.5 * 4000 ** -0.5)  # the peak
    assert lrate(16000, d, w) == pytest.approx(512 ** -0.5 * 16000 ** -0.5)
    assert lrate(w, d, w) > lrate(w - 1, d, w) and lrate(w, d, w) > lrate(w + 1, d, w)
    assert lrate(100, d, w, scale=2.0) == pytest.approx(2 * lrate(100, d, w))


def test_optimizer_follows_the_schedule():
    p = torch.nn.Parameter(torch.zeros(3))
    train = TrainConfig(warmup_steps=10)
    optimizer, schedule = adam_with_schedule([p], train, d_model=64)
    assert optimizer.defaults["betas"] == (0.9, 0.98) and optimizer.defaults["eps"] == 1e-9
    for step in range(1, 30):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(lrate(step, 64, 10))
        p.grad = torch.ones(3)
        optimizer.step()
        schedule.step()


def test_label_smoothing_matches_torch_and_ignores_padding():
    torch.manual_seed(0)
    logits, target = torch.randn(2, 5, 11), torch.randint(1, 11, (2, 5))
    target[1, 3:] = 0
    keep = target != 0
    for eps in (0.0, 0.1, 0.2):
        smoothed, nll = smoothed_loss(logits, target, eps, pad_id=0)
        ref = F.cross_entropy(logits[keep], target[keep], label_smoothing=eps, reduction="sum")
        torch.testing.assert_close(smoothed, ref)
        torch.testing.assert_close(nll, F.cross_entropy(logits[keep], target[keep], reduction="sum"))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_label_smoothing_gradient_is_torchs(dtype):
    """The hand-written backward gives cross_entropy's gradient, padding rows get none, and the
    gradient comes back in the logits' dtype (bf16 under autocast)."""
    torch.manual_seed(0)
    logits, target = torch.randn(3, 4, 13, dtype=torch.float64) * 3, torch.randint(1, 13, (3, 4))
    target[2, 1:] = 0
    keep = target != 0
    for eps in (0.0, 0.1, 0.3):
        ours, ref = (logits.clone().to(dtype).requires_grad_() for _ in range(2))
        (2.5 * smoothed_loss(ours, target, eps, pad_id=0)[0]).backward()
        (2.5 * F.cross_entropy(ref.double()[keep], target[keep], label_smoothing=eps,
                               reduction="sum")).backward()
        assert ours.grad.dtype == dtype and not ours.grad[~keep].any()
        tol = {} if dtype == torch.float64 else {"atol": 2e-2, "rtol": 2e-2}
        torch.testing.assert_close(ours.grad.double(), ref.grad.double(), **tol)
    small = target % 5
    assert torch.autograd.gradcheck(lambda x: smoothed_loss(x, small, 0.1, 0)[0],
                                    logits[:, :, :5].clone().requires_grad_())


@pytest.mark.parametrize("chunk", [13 * 1, 13 * 4, 13 * 100])  # 1 row, 4 rows, all at once
def test_output_loss_is_the_projection_then_the_loss(chunk):
    """Fused and chunked over real tokens: the loss, NLL and both gradients of the tied
    projection followed by ``smoothed_loss``; padding positions get no gradient."""
    torch.manual_seed(0)
    hidden = torch.randn(3, 5, 7, dtype=torch.float64)
    weight = torch.randn(13, 7, dtype=torch.float64)
    target = torch.randint(1, 13, (3, 5))
    target[1, 2:] = 0
    for eps in (0.0, 0.1):
        h1, w1, h2, w2 = (x.clone().requires_grad_() for x in (hidden, weight, hidden, weight))
        ours = output_loss(h1, w1, target, eps, 0, chunk_elements=chunk)
        ref = smoothed_loss(h2 @ w2.t(), target, eps, 0)
        torch.testing.assert_close(ours, ref)
        (3.0 * ours[0]).backward()
        (3.0 * ref[0]).backward()
        torch.testing.assert_close(h1.grad, h2.grad)
        torch.testing.assert_close(w1.grad, w2.grad)
        assert not h1.grad[target == 0].any()
    assert torch.autograd.gradcheck(
        lambda h, w: output_loss(h, w, target, 0.1, 0, chunk_elements=26)[0],
        (hidden.clone().requires_grad_(), weight.clone().requires_grad_()))
    with torch.no_grad():  # evaluation: the loss only
        torch.testing.assert_close(output_loss(hidden, weight, target, 0.1, 0, chunk), ref)


def test_output_loss_under_bf16_autocast_matches_autograds():
    """Under autocast the matmuls run in bf16 as autograd's would; gradients in the inputs'
    dtype (fp32 parameters and activations), close to the unfused path under the same autocast."""
    torch.manual_seed(0)
    hidden, weight = torch.randn(4, 6, 16), torch.randn(50, 16) * 0.3
    target = torch.randint(1, 50, (4, 6))
    target[0, 3:] = 0
    grads = []
    for fused in (True, False):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = (output_loss(h, w, target, 0.1, 0, chunk_elements=100) if fused
                    else smoothed_loss(h @ w.t(), target, 0.1, 0))[0]
        loss.backward()
        assert h.grad.dtype == w.grad.dtype == torch.float32
        grads.append((loss.detach(), h.grad, w.grad))
    for ours, ref in zip(*grads, strict=True):
        torch.testing.assert_close(ours.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_label_smoothing_prefers_a_less_confident_model():
    target = torch.tensor([[2]])
    confident = torch.full((1, 1, 10), -30.0)
    confident[0, 0, 2] = 30.0
    hedged = torch.zeros(1, 1, 10)
    hedged[0, 0, 2] = 5.0
    # Without smoothing the confident model wins; with eps_ls = 0.1 (the paper's) it loses.
    assert smoothed_loss(confident, target, 0.0, 0)[0] < smoothed_loss(hedged, target, 0.0, 0)[0]
    assert smoothed_loss(confident, target, BASE.train.eps_ls, 0)[0] > \
        smoothed_loss(hedged, target, BASE.train.eps_ls, 0)[0]


def test_fused_adam_makes_the_same_updates_as_the_reference_loop():
    torch.manual_seed(0)
    fused, plain = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    plain.load_state_dict(fused.state_dict())
    train = TrainConfig(warmup_steps=3)
    optimizer, schedule = adam_with_schedule(fused.parameters(), train, d_model=64)
    assert optimizer.defaults["fused"]
    reference = torch.optim.Adam(plain.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9,
                                 foreach=False)
    for step in range(1, 8):
        x = torch.randn(5, 8)
        for model in (fused, plain):
            model.zero_grad()
            model(x).square().sum().backward()
        reference.param_groups[0]["lr"] = lrate(step, 64, 3)
        optimizer.step()
        schedule.step()
        reference.step()
    for a, b in zip(fused.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(a, b)
