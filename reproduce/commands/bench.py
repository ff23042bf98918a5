"""``python -m reproduce bench [--gpu]``: speed beside nn.Transformer and MarianMT, or one GPU."""

from __future__ import annotations

import argparse

from reproduce.commands.base import Command


class Bench(Command):
    name = "bench"
    help = ("training and decoding speed beside torch.nn.Transformer and MarianMT, in one process "
            "(reproduce/speed/)")

    def add_arguments(self, b: argparse.ArgumentParser) -> None:
        b.add_argument("--quick", action="store_true", help="fewer batches and rounds (minutes)")
        b.add_argument("--gpu", action="store_true", help="one GPU with the paper's base and big: "
                       "step time, tokens/s, MFU, memory, projected hours -> results/gpu.md (on a "
                       "CPU: says so and checks the same code on a tiny model)")
        b.add_argument("--scales", nargs="+", action="extend",
                       help="scales whose base config to measure (default: cpu paper)")
        b.add_argument("--data", choices=["bible", "synthetic"], default="bible",
                       help="training batches: Bible EN-DE (default) or random ids")
        b.add_argument("--checkpoint", help="trained `cpu`-scale base checkpoint: decode Bible dev "
                       "sentences with it instead of untrained weights on random sources")
        b.add_argument("--precision", default="auto", help="auto (default), 32-true or bf16-mixed")
        b.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
        b.add_argument("--compile", action="store_true", help="add our model under torch.compile")
        b.add_argument("--no-lightning", action="store_true",
                       help="skip the Lightning-loop contender")
        b.add_argument("--set", nargs="+", action="extend", default=[],
                       metavar="SECTION.FIELD=VALUE",
                       help="config values for every scale, as the table commands' --set, e.g. "
                       "model.N=2 (a quick look, or tests)")
        b.add_argument("--budget", type=float, default=420.0, help="with --gpu: seconds after "
                       "which the parts not yet started are skipped (default 420, for a 10-minute "
                       "call with the start); each part is written as it ends")
        b.add_argument("--cap", nargs="+", action="extend", default=[],
                       metavar="PART=SECONDS",
                       help="with --gpu: a part's hard cap in seconds, 0 to skip it, for parts "
                       "compiled, big-compiled, two-passes, peer, peer-compiled, base, big, beam, "
                       "tf32, micro (defaults in reproduce/speed/gpu.py's PARTS)")
        b.add_argument("--seed", type=int, default=0)
        b.add_argument("--out", help="the report (Markdown; default results/performance.md, with "
                       "--gpu results/gpu.md, and on a CPU nothing unless given)")

    def run(self, args: argparse.Namespace, argv: list[str]) -> int:
        if args.gpu:  # imports none of wandb, datasets, optuna or nltk: runs before a kit installs
            from reproduce.speed.gpu import run as check_gpu

            return check_gpu(out=args.out, budget=args.budget, caps=_caps(args.cap))
        from reproduce.records.store import recorded_command
        from reproduce.speed.command import run as run_bench

        args.out = args.out or "results/performance.md"
        return run_bench(args, recorded_command(argv))


def _caps(given: list[str]) -> dict[str, float]:
    """``--cap part=seconds`` as a dict, or a one-line error naming the parts."""
    from reproduce.errors import ConfigError
    from reproduce.speed.gpu import PARTS

    caps = {}
    for item in given:
        key, _, value = item.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if key not in PARTS or seconds < 0:
            raise ConfigError(f"--cap {item}: expected PART=SECONDS with SECONDS >= 0 (0 skips "
                              f"the part) and PART one of {', '.join(PARTS)}")
        caps[key] = seconds
    return caps
