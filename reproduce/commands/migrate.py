"""``python -m reproduce migrate``: records made by older code, brought to what records keep now."""

from __future__ import annotations

import argparse

from reproduce.commands.base import Command, add_results_option


class Migrate(Command):
    name = "migrate"
    help = ("rewrite the records in results/ to what records keep now (W&B folders relative to "
            "the runs root); metrics, configs and tables unchanged")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_results_option(parser)

    def run(self, args: argparse.Namespace, argv: list[str]) -> int:
        from reproduce.paths import results_dir
        from reproduce.records.store import migrate

        changed = migrate(results_dir())
        for line in changed:
            print(line)
        print(f"{len(changed)} record(s) rewritten in {results_dir()}")
        return 0
