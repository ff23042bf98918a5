"""``python -m reproduce publish --table T``: the committed records of a table as W&B runs."""

from __future__ import annotations

import argparse
import sys

from reproduce.commands.base import Command, add_results_option
from reproduce.records.sweep import TABLES


class Publish(Command):
    name = "publish"
    help = ("complete each record's own W&B run (config, metrics, the comparison with base and "
            "the paper, examples, cost; its curve where its training logged none), tag the runs "
            "of superseded records, and log the table and figures; idempotent; offline unless "
            "WANDB_API_KEY is set")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--table", choices=sorted(TABLES))
        which.add_argument("--spec", help="a spec of one's own: its table's records")
        parser.add_argument("--scale", help="only the records of this scale")
        add_results_option(parser)

    def run(self, args: argparse.Namespace, argv: list[str]) -> int:
        from reproduce.errors import ConfigError
        from reproduce.paths import results_dir, runs_dir
        from reproduce.records.store import load_records, read_record
        from reproduce.records.sweep import load_spec
        from reproduce.tables.dashboard import publish
        from reproduce.tables.figures import plot_table
        from reproduce.tables.render import render
        from reproduce.util.logs import quiet_libraries
        from reproduce.util.tracking import wandb_mode

        if wandb_mode() == "disabled":
            raise ConfigError("publish: WANDB_MODE=disabled turns W&B off; unset it (offline "
                              "without WANDB_API_KEY, online with it)")
        quiet_libraries()
        spec = load_spec(args.spec or args.table)
        damaged: list[str] = []
        records = [r for r in load_records(spec.table, results_dir(), damaged)
                   if args.scale in (None, r["scale"])]
        for line in damaged:
            print(f"warning: {line}", file=sys.stderr)
        if not records:
            raise ConfigError(f"{spec.table}: no records" + (f" at scale {args.scale!r}"
                                                             if args.scale else "") + " to publish")
        markdown = results_dir() / f"{spec.table}.md"
        if not markdown.exists():
            render(spec, markdown, log=False)
        folder = runs_dir() / spec.table / "published"
        figures = plot_table(spec, records, folder / "figures")
        old = [r for path in sorted((results_dir() / spec.table / "superseded").glob("*.json"))
               if (r := read_record(path)) is not None and (r.get("wandb") or {}).get("id")
               and args.scale in (None, r["scale"])]
        out = publish(spec, records, markdown, figures, folder, results_dir(), old)
        print(f"{spec.table}: {len(out['published'])} record(s) logged to W&B ({out['mode']}), "
              f"{len(out['unchanged'])} already published unchanged; table "
              + (f"logged ({out['table']['dir']})" if out["table"] else "unchanged"))
        if out["superseded_sharing"]:
            print(f"  {len(out['superseded_sharing'])} superseded record(s) not tagged: their W&B "
                  "run is also the run that redid them (their ids were made before each run had "
                  "its own)")
        if out["mode"] == "offline":
            print(f"  sync with: wandb sync {folder / 'wandb'}")
        return 1 if damaged else 0
