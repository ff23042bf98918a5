"""Beam search on a trained run's dev sentences, as its evaluation decodes them: speed, and
the outputs against another checkout of this repository.

    python benchmarks/beam_search.py --run table3-base-cpu-seed0 [--sentences 300]
        [--against ../reproduce-old] [--threads 1] [--rounds 3]

Loads the run's last checkpoint from this checkout's `runs/` (or ``REPRODUCE_RUNS``, ``--runs``;
the tokenizer cache likewise), decodes the first
`--sentences` dev sentences with ``evaluate.translate`` (the run's beam, length penalty, maximum
length and batches; a parsing run with its tree constraint) and reports sentences per second,
median of `--rounds`. With ``--against DIR`` (e.g. a ``git worktree`` of an older commit) the
same is done with that checkout's ``reproduce`` package, the two interleaved, and the outputs
compared sentence by sentence; exits non-zero if any differs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def decoder(root: Path, run_id: str, sentences: int, batch_tokens: int | None = None):
    """(callable decoding the sentences with the `reproduce` package under `root`, description,
    source tokens per batch). The tokenizer and data are the run's evaluation's
    (``fit.build_data``); batches are ``evaluate.decode_batch_tokens`` unless `batch_tokens` is given
    (an older checkout is handed this one's, so both decode the same batches)."""
    for name in [m for m in sys.modules if m == "reproduce" or m.startswith("reproduce.")]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        from reproduce import paths
        from reproduce.data import is_treebank
        from reproduce.train import evaluate
        from reproduce.train import fit as training
        from reproduce.train.evaluate import translate
        from reproduce.train.lit import TranslationModule
    finally:
        sys.path.pop(0)
    table = run_id.split("-", 1)[0]
    ckpt = paths.runs_dir() / table / run_id / "checkpoints" / "last.ckpt"
    module = TranslationModule.load_from_checkpoint(ckpt, map_location="cpu")
    c, model = module.config, module.model.eval()
    tokenizer, data = training.build_data(c)
    data.setup()  # reads the splits (as the run's training did before its evaluation)
    sources = [s for s, _ in data.dev_pairs[:sentences]]
    parsing = is_treebank(c.data.corpus)
    batch_tokens = batch_tokens or evaluate.decode_batch_tokens(c)
    words = [len(s.split()) for s in sources] if parsing else None

    def run() -> list[str]:
        return translate(model, tokenizer, data.source_batches(sources, batch_tokens), len(sources),
                         c.decode, words=words,
                         copy_words=parsing and c.data.linearization == "words")
    return run, (f"{run_id}: beam {c.decode.beam}, alpha {c.decode.alpha}, {len(sources)} dev "
                 f"sentences in batches of {batch_tokens} source tokens"), batch_tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a finished run id, e.g. table3-base-cpu-seed0")
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument("--against", type=Path, help="another checkout of this repository")
    parser.add_argument("--runs", type=Path, help="runs folder (default: REPRODUCE_RUNS or runs/)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # Both checkouts read this one's runs and tokenizer cache.
    if args.runs:
        os.environ["REPRODUCE_RUNS"] = str(args.runs.resolve())
    os.environ.setdefault("REPRODUCE_RUNS", str(ROOT / "runs"))
    os.environ.setdefault("REPRODUCE_CACHE", str(ROOT / "cache"))
    contenders = {"this checkout": ROOT}
    if args.against:
        contenders[f"--against {args.against}"] = args.against.resolve()
    runs, outputs, times, batch_tokens = {}, {}, {}, None
    for name, root in contenders.items():
        runs[name], title, batch_tokens = decoder(root, args.run, args.sentences, batch_tokens)
        outputs[name] = runs[name]()  # warm-up, and the outputs to compare
        times[name] = []
    print(f"{title}; {args.threads} thread(s), torch {torch.__version__}")
    for _ in range(args.rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, seconds in medians.items():
        print(f"  {name:40s} {args.sentences / seconds:7.2f} sentences/s  "
              f"(rounds: {', '.join(f'{t:.1f}' for t in times[name])} s)")
    if not args.against:
        return 0
    mine, other = outputs.values()
    same = sum(a == b for a, b in zip(mine, other, strict=True))
    ratio = medians[f"--against {args.against}"] / medians["this checkout"]
    print(f"  this checkout is {ratio:.2f}x as fast; identical outputs: {same} of {len(mine)}")
    return 0 if same == len(mine) else 1


if __name__ == "__main__":
    sys.exit(main())
