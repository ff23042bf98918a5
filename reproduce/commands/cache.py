"""``python -m reproduce cache``: the encoded corpora kept under the cache root, and pruning them."""

from __future__ import annotations

import argparse
import time

from reproduce.commands.base import Command


class Cache(Command):
    name = "cache"
    help = ("list the encoded corpora in the cache (size, last use); --prune removes those "
            "unused for --unused-days (runs rebuild what they need)")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--prune", action="store_true",
                            help="remove encoded corpora not used for --unused-days")
        parser.add_argument("--unused-days", type=float, default=0.0, metavar="DAYS",
                            help="with --prune: keep what a run mapped in the last DAYS days "
                                 "(default 0: remove all)")

    def run(self, args: argparse.Namespace, argv: list[str]) -> int:
        from reproduce.paths import cache_dir
        from reproduce.util.cache_folders import cache_entries, prune

        if args.prune:
            removed = prune(cache_dir(), args.unused_days)
            for entry in removed:
                print(f"removed {entry.folder} ({entry.bytes / 1e6:,.0f} MB)")
            print(f"{len(removed)} encoded corpus(es) removed, "
                  f"{sum(e.bytes for e in removed) / 1e9:.2f} GB freed in {cache_dir()}")
            return 0
        entries = cache_entries(cache_dir())
        for e in entries:
            used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
            print(f"{e.folder.name}  {e.corpus}, {e.train_pairs:,} training pairs, "
                  f"{e.bytes / 1e6:,.0f} MB, last used {used}")
        print(cache_summary(entries, cache_dir()))
        return 0


def cache_summary(entries: list, where: object) -> str:
    """One line: how many encoded corpora, how large, where."""
    total = sum(e.bytes for e in entries)
    return (f"cache: {len(entries)} encoded corpus(es), {total / 1e9:.2f} GB in {where}/encoded"
            " (`python -m reproduce cache` lists them, `--prune` removes them)")
