"""``python -m reproduce verify RECORD``: re-run a record's run from nothing and compare."""

from __future__ import annotations

import argparse
from pathlib import Path

from reproduce.commands.base import Command


class Verify(Command):
    name = "verify"
    help = ("re-run a record's run from nothing in a scratch folder and compare every metric and "
            "hash with the record (reproduce/train/replay.py)")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("record", help="a record, e.g. results/table3/table3-base-cpu-seed0.json")
        parser.add_argument("--steps", type=int, help="train the first N steps only and compare "
                            "the learning curve there")
        parser.add_argument("--scratch", help="the scratch folder (default: a new temporary one)")
        parser.add_argument("--tolerance", type=float, default=0.0, metavar="REL",
                            help="numbers agree within this relative difference (default 0: "
                            "equal); a run replayed on other hardware or in another precision "
                            "needs one (docs/devices.md)")
        parser.add_argument("--precision", choices=("32-true", "bf16-mixed"),
                            help="re-run in this precision instead of the record's")
        parser.add_argument("--spec", help="the spec of one's own that planned the record, to "
                            "say whether it still plans the recorded config (default: the "
                            "shipped spec of its table)")

    def run(self, args: argparse.Namespace, argv: list[str]) -> int:
        from reproduce.train.replay import verify
        from reproduce.util.logs import quiet_libraries

        quiet_libraries()
        return verify(Path(args.record), args.steps, Path(args.scratch) if args.scratch else None,
                      args.tolerance, args.precision, args.spec)
