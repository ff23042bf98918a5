"""The label-smoothed loss with its hand-written backward against autograd's: speed and gradient.

    python benchmarks/loss.py [--threads 2] [--batches 8] [--rounds 4]

``optim.smoothed_loss`` writes the gradient out (softmax - q); the reference is the same formula
left to autograd (log-softmax, gather, mean). At the `cpu` scale's base config, on Bible training
batches (``reproduce.bench.Bible``), it times the loss alone (forward + backward on the first
batch's logits) and a whole training step (forward, loss, backward, Adam) with each loss, the
contenders interleaved (``reproduce.bench.interleaved``); medians are reported. Exits non-zero if
the two gradients differ by more than 1e-4 (float rounding is ~1e-5).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys

import torch
import torch.nn.functional as F

from reproduce.bench import Bible, _plain_step, interleaved, machine
from reproduce.model import Transformer
from reproduce.optim import smoothed_loss
from reproduce.sweep import load_spec


def autograd_loss(logits, target, eps_ls: float, pad_id: int):
    """``smoothed_loss`` as it was before its backward was written out."""
    logp = F.log_softmax(logits.float(), dim=-1)
    keep = target != pad_id
    nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)[keep].sum()
    uniform = -logp.mean(dim=-1)[keep].sum()
    return (1.0 - eps_ls) * nll + eps_ls * uniform, nll.detach()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, default=8, help="training batches per round")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = load_spec("table3").resolve("base", "cpu")
    m, eps = config.model, config.train.eps_ls
    batches, _ = Bible(m.vocab_size, config.train.max_tokens_per_sentence, 0).batches(
        config.train.batch_tokens, args.batches)
    info = machine()
    print(f"{info['cpu']}, {info['cores']} cores, load average {info['load_average'][0]:.2f}; "
          f"torch {info['torch']}, {info['threads']} threads; `cpu` base, {len(batches)} Bible "
          "batches per round")

    losses = {"autograd": autograd_loss, "ours": smoothed_loss}
    first = batches[0]
    with torch.no_grad():
        logits = Transformer(m)(first["src"], first["tgt_in"])
    grads = {}
    for name, loss in losses.items():
        x = logits.clone().requires_grad_()
        loss(x, first["tgt_out"], eps, m.pad_id)[0].backward()
        grads[name] = x.grad
    diff = (grads["ours"] - grads["autograd"]).abs().max().item()
    print(f"largest gradient difference: {diff:.1e}")

    def loss_only(loss):
        def run():
            x = logits.clone().requires_grad_()
            loss(x, first["tgt_out"], eps, m.pad_id)[0].backward()
        return run

    model = Transformer(m)
    steps = {}
    for name, loss in losses.items():
        own = copy.deepcopy(model)

        def step_loss(batch, own=own, loss=loss):
            total, _ = loss(own(batch["src"], batch["tgt_in"]), batch["tgt_out"], eps, m.pad_id)
            return total, (batch["tgt_out"] != m.pad_id).sum()
        step = _plain_step(own, step_loss, config, "32-true")
        steps[name] = lambda step=step: step(batches)

    for title, contenders, per in (
            ("loss forward + backward", {n: loss_only(f) for n, f in losses.items()}, 1),
            ("training step", steps, len(batches))):
        times = interleaved(contenders, args.rounds)
        medians = {n: statistics.median(t) / per for n, t in times.items()}
        for name, seconds in medians.items():
            print(f"{title:24s} {name:9s} {1000 * seconds:8.1f} ms   "
                  f"(min-max {1000 * min(times[name]) / per:.1f}-{1000 * max(times[name]) / per:.1f})")
        print(f"{title:24s} ours is {medians['autograd'] / medians['ours']:.2f}x autograd's speed")
    return 0 if diff <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
