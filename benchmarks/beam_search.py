"""Beam search on a trained run's dev sentences, as its evaluation decodes them: speed, and
the outputs against another checkout of this repository.

    python benchmarks/beam_search.py --run table3-base-cpu-seed0 [--sentences 300]
        [--against ../reproduce-old] [--threads 1] [--rounds 3]

Loads the run's last checkpoint from `runs/` (``REPRODUCE_RUNS``), decodes the first
`--sentences` dev sentences with ``evaluate.translate`` (the run's beam, length penalty, maximum
length and batches; a parsing run with its tree constraint) and reports sentences per second,
median of `--rounds`. With ``--against DIR`` (e.g. a ``git worktree`` of an older commit) the
same is done with that checkout's ``reproduce`` package, the two interleaved, and the outputs
compared sentence by sentence; exits non-zero if any differs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def decoder(root: Path, run_id: str, runs: Path | None, sentences: int):
    """(callable decoding the sentences with the `reproduce` package under `root`, description)."""
    for name in [m for m in sys.modules if m == "reproduce" or m.startswith("reproduce.")]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        from reproduce.data import TranslationData, is_treebank, load_pairs, tokenizer_name
        from reproduce.evaluate import translate
        from reproduce.lit import TranslationModule
        from reproduce.runner import runs_dir
        from reproduce.tokenizer import cache_dir, load_tokenizer, model_path
    finally:
        sys.path.pop(0)
    table = run_id.split("-", 1)[0]
    ckpt = (runs or runs_dir()) / table / run_id / "checkpoints" / "last.ckpt"
    module = TranslationModule.load_from_checkpoint(ckpt, map_location="cpu")
    c, model = module.config, module.model.eval()
    d = c.data
    tokenizer = load_tokenizer(model_path(
        tokenizer_name(d.corpus, d.data_dir or None, d.extra_trees or None, d.linearization),
        c.model.vocab_size, cache_dir()))
    data = TranslationData(d.corpus, tokenizer, c.train.batch_tokens, data_dir=d.data_dir or None,
                           linearization=d.linearization)
    pairs = load_pairs(d.corpus, "dev", d.data_dir or None, linearization=d.linearization)
    sources = [s for s, _ in pairs[:sentences]]
    parsing = is_treebank(d.corpus)
    # As runner.task_scores batches them: parses by tokens / beam (longer outputs).
    batch_tokens = max(64, c.train.batch_tokens // c.decode.beam) if parsing else c.train.batch_tokens
    words = [len(s.split()) for s in sources] if parsing else None

    def run() -> list[str]:
        return translate(model, tokenizer, data.source_batches(sources, batch_tokens), len(sources),
                         c.decode, words=words, copy_words=parsing and d.linearization == "words")
    return run, (f"{run_id}: beam {c.decode.beam}, alpha {c.decode.alpha}, {len(sources)} dev "
                 f"sentences in batches of {batch_tokens} source tokens")


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
    contenders = {"this checkout": ROOT}
    if args.against:
        contenders[f"--against {args.against}"] = args.against.resolve()
    runs, outputs, times = {}, {}, {}
    for name, root in contenders.items():
        runs[name], title = decoder(root, args.run, args.runs, args.sentences)
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
