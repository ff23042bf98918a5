"""``python -m reproduce status``: per table and scale, what is done, running, stopped, missing."""

from __future__ import annotations

import argparse
import sys

from reproduce.commands.base import Command, add_results_option


class Status(Command):
    name = "status"
    help = "per table and scale: runs done, running, stopped and missing, and the cost so far"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--all", action="store_true", help="also list the missing runs")
        parser.add_argument("--spec", action="append", help="a spec of one's own (repeatable): "
                            "its table instead of the shipped ones")
        add_results_option(parser)

    def run(self, args: argparse.Namespace, argv: list[str]) -> int:
        from reproduce.commands.cache import cache_summary
        from reproduce.launch.progress import report
        from reproduce.paths import cache_dir, results_dir, runs_dir
        from reproduce.util.cache_folders import cache_entries

        damaged: list[str] = []
        print(report(results_dir(), runs_dir(), verbose=args.all, damaged=damaged,
                     specs=args.spec))
        print(cache_summary(cache_entries(cache_dir()), cache_dir()))
        for line in damaged:
            print(f"warning: {line}", file=sys.stderr)
        return 1 if damaged else 0
