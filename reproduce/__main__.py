"""Command line: ``python -m reproduce table3 --row A`` (parse and dispatch only)."""

from __future__ import annotations

import argparse
import json
import sys

from .config import ConfigError
from .sweep import load_spec


def _params(args: argparse.Namespace) -> None:
    from .cost import parameter_rows

    rows = parameter_rows(load_spec(args.table), args.vocab_size)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"Table 3 parameter counts at the paper's sizes, shared vocabulary {args.vocab_size} "
          "(tied source/target/softmax embedding; biases and LayerNorms included).")
    print("The paper's column fits a tied vocabulary of about 41000 better than 37000 "
          "(--vocab-size 41000 to compare).\n")
    header = f"{'variant':8} {'N':>2} {'d_model':>7} {'d_ff':>5} {'h':>3} {'d_k':>4} {'d_v':>4} "
    print(header + f"{'positions':>10} {'ours (M)':>9} {'paper (M)':>9}")
    for r in rows:
        paper = "" if r["paper_params_m"] is None else f"{r['paper_params_m']:>9}"
        print(f"{r['variant']:8} {r['N']:>2} {r['d_model']:>7} {r['d_ff']:>5} {r['h']:>3} "
              f"{r['d_k']:>4} {r['d_v']:>4} {r['positions']:>10} {r['params'] / 1e6:>9.1f} "
              f"{paper:>9}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m reproduce", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    t3 = sub.add_parser("table3", help="Table 3: variations on the architecture")
    t3.add_argument("--params", action="store_true",
                    help="print parameter counts of all variants at the paper's sizes and exit")
    t3.add_argument("--vocab-size", type=int, default=37000,
                    help="shared vocabulary for --params (default 37000, the paper's)")
    t3.add_argument("--json", action="store_true", help="with --params: print JSON")
    t3.set_defaults(table="table3")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.params:
            _params(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
