"""Command line: ``python -m reproduce table3 --row A``. Parse, then dispatch to a command of
``reproduce/commands/`` (each owns its arguments and its body)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from reproduce import __version__
from reproduce.commands import rank
from reproduce.commands.attention import Attention
from reproduce.commands.base import Command
from reproduce.commands.bench import Bench
from reproduce.commands.bible_db import BibleDb
from reproduce.commands.cache import Cache
from reproduce.commands.migrate import Migrate
from reproduce.commands.publish import Publish
from reproduce.commands.status import Status
from reproduce.commands.table import Table, Table3, Table4
from reproduce.commands.verify import Verify
from reproduce.errors import (
    ConfigError,
    DamagedRecords,
    DataError,
    DiskError,
    NoRoom,
    OutOfMemory,
    RankFailure,
)
from reproduce.paths import use_results
from reproduce.util.exits import end
from reproduce.util.secrets import mask

# The table of commands, in the order --help lists them.
COMMANDS: list[Command] = [
    Table("table2", "Table 2: BLEU and training cost, base and big, EN-DE and EN-FR"),
    Table3("table3", "Table 3: variations on the architecture"),
    Table4("table4", "Table 4: English constituency parsing, WSJ section 23 F1"),
    Bench(), Status(), Cache(), Publish(), Verify(), Attention(), BibleDb(), Migrate(),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m reproduce", description=__doc__)
    parser.add_argument("--version", action="version", version=f"reproduce {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_arguments(sub.add_parser(command.name, help=command.help))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == [rank.NAME] and len(argv) == 2:  # one rank of a multi-device run
            return rank.run_rank(argv[1])
        args = build_parser().parse_args(argv)
        command = next(c for c in COMMANDS if c.name == args.command)
        if getattr(args, "results", None):
            use_results(args.results)
        return command.run(args, argv)
    except (ConfigError, DataError, NoRoom) as e:
        print(f"error: {mask(str(e))}", file=sys.stderr)
        return 2
    except (RankFailure, DamagedRecords, OutOfMemory, DiskError) as e:
        print(f"error: {mask(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C outside training (training saves its step: Stopped)
        print("interrupted (Ctrl-C); run the same command again to go on", file=sys.stderr)
        return 130


def run() -> NoReturn:
    """``python -m reproduce`` and the ``reproduce`` script: ``main``, then the process ends with
    its code, without tearing down every module it imported (``util.exits.end``)."""
    end(main)


if __name__ == "__main__":
    run()
