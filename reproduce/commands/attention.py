"""``python -m reproduce attention --run RUN``: attention maps, as the paper's Figures 3-5."""

from __future__ import annotations

import argparse

from reproduce.commands.base import Command, add_results_option


class Attention(Command):
    name = "attention"
    help = ("attention maps of a trained run for one sentence (results/attention-<run>.png), as "
            "the paper's Figures 3-5")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--run", required=True, help="a run id, e.g. table3-base-cpu-seed0")
        parser.add_argument("--sentence", help="the English source sentence (default: John 1:1)")
        parser.add_argument("--layer", type=int, help="encoder layer, 1-based (default: the next "
                            "to last)")
        add_results_option(parser)

    def run(self, args: argparse.Namespace, argv: list[str]) -> int:
        from reproduce.paths import results_dir, runs_dir
        from reproduce.tables.attention_maps import draw

        print(f"plotted {draw(args.run, args.sentence, args.layer, results_dir(), runs_dir())}")
        return 0
