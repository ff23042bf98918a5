"""Command line: ``python -m reproduce table3 --row A`` (parse and dispatch only)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings

from .config import ConfigError
from .sweep import load_spec

TABLES = {"table2": "Table 2: BLEU and training cost, base and big, EN-DE and EN-FR",
          "table3": "Table 3: variations on the architecture"}


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


def _quiet_libraries() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*on_validation_epoch_end.*sync_dist.*")


def _run_table(args: argparse.Namespace, argv: list[str]) -> None:
    from .results import RENDERERS, load_records
    from .runner import default_scale, execute, planned_summary, results_dir

    spec = load_spec(args.spec or args.table)
    scale = args.scale or default_scale()
    names = spec.select(args.row, args.variant)
    runs = spec.plan(names, scale, args.seeds)
    sc = spec.scale(scale)
    print(f"{spec.table}: {len(runs)} run(s) at scale `{scale}`"
          f"{'' if args.scale else ' (default for this machine; --scale to change)'}: {sc.about}")
    for run in runs:
        print("  " + planned_summary(run, spec.variants[run.variant].overrides))
    if args.dry_run:
        from .cost import estimate

        print("estimates from a measured training step on this machine (no data, no network):")
        for run in runs:
            print("  " + estimate(run.run_id, run.config))
        return
    _quiet_libraries()
    command = "python -m reproduce " + " ".join(argv)
    out = results_dir() / f"{spec.table}.md"
    try:
        for run in runs:
            m = execute(run, spec.split, command)["metrics"]
            print(f"{run.run_id}: dev PPL {m['dev_ppl']}, dev BLEU {m['dev_bleu']}, "
                  f"test BLEU {m['test_bleu']}, {m['params'] / 1e6:.2f}M params, "
                  f"{m['train_seconds']:.0f} s training")
    finally:
        out.parent.mkdir(parents=True, exist_ok=True)
        render = RENDERERS.get(spec.table, RENDERERS["table3"])
        out.write_text(render(spec, load_records(spec.table, results_dir())))
        print(f"rendered {out}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m reproduce", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for table, about in TABLES.items():
        t = sub.add_parser(table, help=about)
        t.add_argument("--row", action="append", help="a row of the table (repeatable): "
                       "runs base and the row's variants")
        t.add_argument("--variant", action="append", help="one variant (repeatable)")
        t.add_argument("--scale", help="paper, cpu or smoke (default: fits this machine)")
        t.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds (default 0)")
        t.add_argument("--dry-run", action="store_true", help="print the plan and exit")
        t.add_argument("--spec", help=f"a sweep spec file instead of sweeps/{table}.yaml")
        t.set_defaults(table=table)
    t3 = sub.choices["table3"]
    t3.add_argument("--params", action="store_true",
                    help="print parameter counts of all variants at the paper's sizes and exit")
    t3.add_argument("--vocab-size", type=int, default=37000,
                    help="shared vocabulary for --params (default 37000, the paper's)")
    t3.add_argument("--json", action="store_true", help="with --params: print JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    from .data import DataError

    try:
        if getattr(args, "params", False):
            _params(args)
        else:
            _run_table(args, argv)
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
