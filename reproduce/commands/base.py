"""What every command is: a name, a line of help, the arguments it owns and its body."""

from __future__ import annotations

import argparse


class Command:
    """One subcommand of ``python -m reproduce``."""

    name: str
    help: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Declare this command's options on its own subparser."""

    def run(self, args: argparse.Namespace, argv: list[str]) -> int:
        """Do the work; ``argv`` is the raw command line (records store it). An exit status."""
        raise NotImplementedError


def positive_or_auto(value: str) -> int | str:
    """``--workers``, ``--devices``: a positive number or ``auto``."""
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number or 'auto', got {value!r}")
    return n


def add_results_option(parser: argparse.ArgumentParser) -> None:
    """``--results DIR``, for the commands that read or write records (``paths.use_results``)."""
    parser.add_argument("--results", metavar="DIR", help="records, tables and figures in DIR and "
                        "runs in DIR/runs instead of the project's results/ and runs/ (your own "
                        "sweep beside ours)")
