"""The training pieces: the paper's schedule and label-smoothed loss."""

import pytest
import torch
import torch.nn.functional as F

from reproduce.config import BASE, TrainConfig
from reproduce.optim import adam_with_schedule, lrate, smoothed_loss


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
