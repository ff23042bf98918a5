"""The label-smoothed loss two ways: autograd's, and fused with the output projection (what
training uses). Speed and gradient.

    python benchmarks/loss.py [--threads 2] [--batches 8] [--rounds 4]

At the `cpu` scale's base config, on Bible training batches (``reproduce.speed.inputs.Bible``):

* ``autograd``: the tied projection to logits, then the loss formula left to autograd
  (log-softmax, gather, mean);
* ``fused``: ``optim.output_loss`` (what training uses): projection, loss and gradients in
  chunks over the real target tokens, no (tokens, V) logits in memory.

It times the output layer alone (projection + loss, forward + backward, from the first batch's
decoder output) and a whole training step (forward, loss, backward, Adam) with each, the
contenders interleaved (``reproduce.speed.timing.interleaved``); medians are reported. Exits non-zero if
a gradient (decoder output and shared embedding) differs from autograd's by more than 1e-4 of
its largest entry (float rounding is ~1e-6).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys

import torch
import torch.nn.functional as F

from reproduce.paper.model import Transformer
from reproduce.paper.optim import output_loss
from reproduce.records.sweep import load_spec
from reproduce.speed.inputs import Bible
from reproduce.speed.report import environment
from reproduce.speed.timing import interleaved
from reproduce.speed.training import plain_step


def autograd_loss(logits, target, eps_ls: float, pad_id: int):
    """The label-smoothed loss and NLL sum, left to autograd."""
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
    info = environment()
    print(f"{info['cpu']}, {info['cores']} cores, load average {info['load_average'][0]:.2f}; "
          f"torch {info['torch']}, {info['threads']} threads; `cpu` base, {len(batches)} Bible "
          "batches per round")

    def projected(loss):
        return lambda hidden, weight, target: loss(hidden @ weight.t(), target, eps, m.pad_id)
    losses = {"autograd": projected(autograd_loss),
              "fused": lambda hidden, weight, target: output_loss(hidden, weight, target, eps,
                                                                  m.pad_id)}
    model = Transformer(m)
    first = batches[0]
    with torch.no_grad():
        hidden = model.features(first["src"], first["tgt_in"])
    weight = model.embed.weight.detach()
    grads = {}
    for name, loss in losses.items():
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        loss(h, w, first["tgt_out"])[0].backward()
        grads[name] = h.grad, w.grad
    # Relative to the gradient's largest entry (the embedding's sums over ~2000 tokens).
    diff = max(((a - b).abs().max() / b.abs().max()).item() for name in ("fused",)
               for a, b in zip(grads[name], grads["autograd"], strict=True))
    print(f"largest gradient difference from autograd's, relative to the largest entry: {diff:.1e}")

    def output_layer(loss):
        def run():
            h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
            loss(h, w, first["tgt_out"])[0].backward()
        return run

    steps = {}
    for name, loss in losses.items():
        own = copy.deepcopy(model)

        def step_loss(batch, own=own, loss=loss):
            total, _ = loss(own.features(batch["src"], batch["tgt_in"]), own.embed.weight,
                            batch["tgt_out"])
            return total, (batch["tgt_out"] != m.pad_id).sum()
        step = plain_step(own, step_loss, config, "32-true")
        steps[name] = lambda step=step: step(batches)

    for title, contenders, per in (
            ("output layer fwd + bwd", {n: output_layer(f) for n, f in losses.items()}, 1),
            ("training step", steps, len(batches))):
        times = interleaved(contenders, args.rounds)
        medians = {n: statistics.median(t) / per for n, t in times.items()}
        for name, seconds in medians.items():
            print(f"{title:24s} {name:9s} {1000 * seconds:8.1f} ms   "
                  f"(min-max {1000 * min(times[name]) / per:.1f}-{1000 * max(times[name]) / per:.1f})")
        print(f"{title:24s} " + ", ".join(
            f"{n} {medians['autograd'] / medians[n]:.2f}x" for n in medians) + " autograd's speed")
    return 0 if diff <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
