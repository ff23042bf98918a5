"""Why a run's training step is slower than ``bench --gpu``'s: batches of a new shape each step.

    python benchmarks/attention_shapes.py [--steps 20] [--out shapes.json] [--scale paper]

``bench --gpu`` times one fixed batch (sentences of 32 pieces); a run's token-count batches have
another (sentences, length) shape almost every step. This times the paper's base (Table 2's
config, bf16-mixed on a GPU, micro-batches of ``device_batch_tokens`` accumulated as one GPU
would) over ``--steps`` optimizer steps of

1. one fixed shape (as ``bench --gpu``);
2. a new shape each micro-batch (source and target lengths drawn from 10 to 100 pieces, as many
   sentences as fill the micro-batch), with torch's attention backends as they are;
3. the same shapes with cuDNN's attention turned off (``torch.backends.cuda.enable_cudnn_sdp``);
4. the same shapes with lengths rounded up to a multiple of 16 (fewer distinct shapes);

and writes seconds per step of each, with the attention backends torch had enabled.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from reproduce.paper.model import Transformer  # noqa: E402
from reproduce.paper.optim import adam_with_schedule  # noqa: E402
from reproduce.records.sweep import load_spec  # noqa: E402
from reproduce.train.step_time import step_loss  # noqa: E402


def batch(vocab: int, tokens: int, s: int, t: int, device: str) -> dict[str, torch.Tensor]:
    b = max(1, tokens // max(s, t))
    src = torch.randint(4, vocab, (b, s), device=device)
    tgt = torch.randint(4, vocab, (b, t + 1), device=device)
    return {"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--scale", default="paper")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device, precision = ("cuda", "bf16-mixed") if cuda else ("cpu", "32-true")
    config = load_spec("table2").resolve("base-en-de", args.scale if cuda else "smoke")
    m, t = config.model, config.train
    accumulate, micro = t.split_batch(1)
    torch.manual_seed(0)
    model = Transformer(m).to(device).train()
    optimizer, schedule = adam_with_schedule(model.parameters(), t, m.d_model)
    rng = random.Random(0)
    drawn = [(rng.randint(10, 100), rng.randint(10, 100)) for _ in range(args.steps * accumulate)]

    def rounded(n: int) -> int:
        return -(-n // 16) * 16

    cases = {"fixed shape (bench --gpu's)": [(32, 32)] * len(drawn),
             "a new shape each micro-batch": drawn,
             "new shapes, cuDNN attention off": drawn,
             "new shapes, lengths rounded up to 16": [(rounded(s), rounded(q)) for s, q in drawn]}
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    result = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
              "backends": {name: getattr(torch.backends.cuda, f"{name}_sdp_enabled")()
                           for name in ("flash", "mem_efficient", "cudnn", "math")},
              "accumulate": accumulate, "micro_batch_tokens": micro, "steps": args.steps,
              "seconds_per_step": {}}
    for name, shapes in cases.items():
        torch.backends.cuda.enable_cudnn_sdp("cuDNN attention off" not in name
                                              and result["backends"]["cudnn"])
        def step(micro_shapes: list[tuple[int, int]]) -> None:  # as step_time.train_step
            for s, q in micro_shapes:
                with torch.autocast(device, dtype=torch.bfloat16, enabled=cuda):
                    loss = step_loss(model, batch(m.vocab_size, micro, s, q, device), t.eps_ls,
                                     m.pad_id)
                (loss / accumulate).backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)

        step([(32, 32)] * accumulate)  # warm-up
        sync()
        start = time.perf_counter()
        for k in range(args.steps):
            step(shapes[k * accumulate:(k + 1) * accumulate])
        sync()
        seconds = (time.perf_counter() - start) / args.steps
        result["seconds_per_step"][name] = round(seconds, 4)
        print(f"{name}: {seconds:.3f} s/step", flush=True)
        if args.out:
            args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
