"""``python -m reproduce table2|table3|table4``: the arguments of a table command, checked, and the
runs they plan; launching them (here, in worker processes, or as SLURM array tasks) and rendering
the table is ``launch.dispatch.launch_table``'s. ``table3 --params`` counts parameters."""

from __future__ import annotations

import argparse
import os

from reproduce.commands.base import Command, add_results_option, positive_or_auto
from reproduce.config import ACCELERATORS


class Table(Command):
    """One of the paper's tables: its sweep spec's runs, then its page in ``results/``."""

    def __init__(self, name: str, about: str):
        self.name, self.help = name, about

    def add_arguments(self, t: argparse.ArgumentParser) -> None:
        t.add_argument("--row", action="append", help="a row of the table (repeatable): "
                       "runs base and the row's variants")
        t.add_argument("--variant", action="append", help="one variant (repeatable)")
        t.add_argument("--scale", help="a scale of sweeps/scales.yaml or of the spec: paper, "
                       "cpu, smoke, ... (default: paper with --on GPU, else what fits this machine)")
        t.add_argument("--seeds", type=int, nargs="+", action="extend",
                       help="seeds (default 0)")
        t.add_argument("--dry-run", action="store_true", help="print the plan and what each run "
                       "should take, from counted FLOPs and a cached probe, and exit")
        t.add_argument("--on", help="with --dry-run: plan for other hardware, e.g. 8xH100, "
                       "A100, or cpu (this machine, the default); with --launcher slurm: the GPU "
                       "the nodes hold (e.g. H100): each run's time limit from its estimate. A GPU "
                       "named makes `paper` the default scale")
        t.add_argument("--render", action="store_true", help="train nothing: render "
                       f"results/{self.name}.md (and its figures) from the records there and exit")
        t.add_argument("--spec", help=f"a sweep spec file instead of sweeps/{self.name}.yaml")
        t.add_argument("--launcher", choices=["local", "slurm"], default="local",
                       help="local: train on this machine (default; --workers says how many "
                       "processes); slurm: submit one job-array task per run with submitit")
        t.add_argument("--gpus-per-node", "--gpus", dest="gpus", type=int, help="with "
                       "--launcher slurm: GPUs (one task each) per node of a run (default: by "
                       "scale, 8 at `paper`)")
        t.add_argument("--nodes", type=int, default=1, help="with --launcher slurm: nodes one "
                       "run trains on (default 1); every node's tasks join one DDP run")
        t.add_argument("--partition", help="with --launcher slurm: the SLURM partition")
        t.add_argument("--slurm", action="append", default=[], metavar="KEY=VALUE",
                       help="with --launcher slurm: an sbatch option for every array "
                       "(repeatable), e.g. time=24:00:00 mem=64G cpus-per-task=8 account=X "
                       "qos=Y constraint=a100; over the scale's defaults (docs/cluster.md)")
        t.add_argument("--workers", type=positive_or_auto, default="auto", help="local: train "
                       "with N processes that split the cores (or one GPU each), runs balanced "
                       "by measured cost; auto (default): one per core on a CPU when two or more "
                       "runs have 1000+ steps left between them, else 1 (on a 2-core CPU 2 "
                       "trains a row ~1.3x faster)")
        t.add_argument("--devices", type=positive_or_auto, help="devices one run trains on: "
                       "N (DDP over N GPUs, or N CPU processes with cores / N threads each, "
                       "gloo) or auto (every visible GPU; 1 on a CPU); default: the scale's "
                       "(`paper`: auto, else 1). The paper's batch is kept by accumulation")
        t.add_argument("--accelerator", choices=ACCELERATORS, default="auto",
                       help="auto (default: GPU if torch sees one), cpu or gpu")
        t.add_argument("--tune", action="store_true", help="tune the spec's nuisance settings "
                       "(`tune:`; never what a row varies) on the dev split with optuna first, "
                       "then run the best")
        t.add_argument("--trials", type=int, default=10, help="with --tune: trials to add to the "
                       "study (default 10, at least 1); running again resumes the same study")
        t.add_argument("--storage", help="with --tune: an optuna storage URL shared by workers, "
                       "or journal:PATH (optuna's journal file) (default: sqlite:///runs/optuna.db;"
                       " with --launcher slurm, journal:runs/optuna.journal)")
        t.add_argument("--set", nargs="+", action="extend", default=[],
                       metavar="SECTION.FIELD=VALUE",
                       help="config values for every run, over the spec and scale, e.g. "
                       "train.warmup_steps=8000 decode.beam=8, repeatable (checked as a spec is; "
                       "not what a chosen row varies); recorded. Needs --results DIR in a checkout")
        t.add_argument("--skip-disk-check", action="store_true", help="start runs even where "
                       "the free space is short of what their checkpoints need (the plan says "
                       "how much each needs)")
        add_results_option(t)

    def run(self, args: argparse.Namespace, argv: list[str]) -> int:
        from reproduce.records.disk import SKIP_ENV
        from reproduce.records.sweep import load_spec, sets_line, with_sets

        if args.skip_disk_check:  # in the environment: workers and ranks see it too
            os.environ[SKIP_ENV] = "1"
        from reproduce.plan.gpu_prices import names_gpu
        from reproduce.util.machine import default_scale

        spec = load_spec(args.spec or self.name, kind=self.name)
        # runs planned or submitted --on GPUs are the paper's, wherever the command is typed
        scale = args.scale or ("paper" if names_gpu(args.on) else default_scale())
        sets = _sets(args.set)
        runs = self.planned(spec, scale, args)
        set_line = sets_line(runs, sets) if sets else ""
        runs = with_sets(runs, spec, sets)
        _check_cluster_options(args)
        tuning = spec.search_space(scale) if args.tune else None
        if tuning:
            from reproduce.train.tuning import check_trials
            check_trials(args.trials)
        where = f"--on {args.on}" if names_gpu(args.on) else "this machine"
        print(f"{spec.table}: {len(runs)} run(s) at scale `{scale}`"
              f"{'' if args.scale else f' (default for {where}; --scale to change)'}: "
              f"{spec.scale(scale).about}")
        _overridden_line(spec, scale)
        if set_line:
            print(set_line)
        todo = self.announce(spec, runs, args, tuning)
        from reproduce.launch.dispatch import launch_table
        return 1 if launch_table(_options(args), argv, spec, todo, scale, tuning, self.report) else 0

    def planned(self, spec, scale: str, args: argparse.Namespace) -> list:
        return spec.plan(spec.select(args.row, args.variant, scale), scale,
                         list(dict.fromkeys(args.seeds or [0])))

    def announce(self, spec, runs: list, args: argparse.Namespace, tuning) -> list:
        """Print each planned run; return those to run."""
        from reproduce.records.sweep import planned_summary

        for run in runs:
            print("  " + planned_summary(run, spec.variants[run.variant].overrides))
        return runs

    @staticmethod
    def report(m: dict) -> str:
        """A finished run's line: its headline metrics."""
        return (f"dev PPL {m['dev_ppl']}, dev BLEU {m['dev_bleu']}, test BLEU {m['test_bleu']}, "
                f"{m['params'] / 1e6:.2f}M params, {m['train_seconds']:.0f} s training")


class Table3(Table):
    """Table 3, which can also count every variant's parameters at the paper's sizes."""

    def add_arguments(self, t: argparse.ArgumentParser) -> None:
        super().add_arguments(t)
        t.add_argument("--params", action="store_true",
                       help="print parameter counts of all variants at the paper's sizes and exit")
        t.add_argument("--vocab-size", type=int, default=37000,
                       help="shared vocabulary for --params (default 37000, the paper's)")
        t.add_argument("--json", action="store_true", help="with --params: print JSON")

    def run(self, args: argparse.Namespace, argv: list[str]) -> int:
        if args.params:
            _print_params(self.name, args.vocab_size, args.json)
            return 0
        return super().run(args, argv)


class Table4(Table):
    """Table 4: the parser's rows, on the user's treebank or NLTK's sample, tuned or not."""

    def add_arguments(self, t: argparse.ArgumentParser) -> None:
        super().add_arguments(t)
        t.add_argument("--treebank", help="the Penn Treebank's parsed/mrg/wsj (sections 02-23); "
                       "default: NLTK's WSJ sample, found through NLTK_DATA")
        t.add_argument("--silver", help="bracketed trees (a file or folder) added to training for "
                       "the semi-supervised row; without them that row is not run")

    def run(self, args: argparse.Namespace, argv: list[str]) -> int:
        from reproduce.errors import ConfigError

        for flag, path, what in (("--treebank", args.treebank, "the Penn Treebank's parsed/mrg/wsj"),
                                 ("--silver", args.silver, "bracketed trees, a file or a folder")):
            if path and not os.path.exists(path):
                raise ConfigError(f"{flag} {path!r}: no such file or folder ({what})")
        if args.launcher != "local":
            raise ConfigError(f"--launcher {args.launcher}: table4 runs locally only, for now")
        return super().run(args, argv)

    def planned(self, spec, scale: str, args: argparse.Namespace) -> list:
        from reproduce.records.sweep import with_data

        return [with_data(run, args.treebank, args.silver)
                for run in super().planned(spec, scale, args)]

    def announce(self, spec, runs: list, args: argparse.Namespace, tuning) -> list:
        from reproduce.data import missing_input
        from reproduce.records.sweep import planned_summary

        print("  data: " + (f"Penn Treebank WSJ at {args.treebank}" if args.treebank else
                            "NLTK's WSJ sample (NLTK_DATA); --treebank DIR for the full WSJ"))
        todo = []
        for run in runs:
            print("  " + planned_summary(run, spec.variants[run.variant].overrides))
            why = missing_input(run.config.data.corpus, run.config.data.extra_trees)
            if why:
                print(f"    not run: {why}")
            else:
                todo.append(run)
        if tuning:
            goal = "maximising" if tuning.direction == "maximize" else "minimising"
            print(f"  tuning: {args.trials} more trial(s) per run, {goal} {tuning.metric} on dev")
            for knob in tuning.knobs.values():
                print(f"    {knob.name}: " + (f"one of {list(knob.choices)}" if knob.choices else
                                               f"{knob.low:g} .. {knob.high:g}"
                                               + (" (log scale)" if knob.log else "")))
        return todo

    @staticmethod
    def report(m: dict) -> str:
        return (f"dev F1 {m['dev_f1']}, test F1 {m['test_f1']} (P {m['test_precision']}, R "
                f"{m['test_recall']}), dev PPL {m['dev_ppl']}, {m['params'] / 1e6:.2f}M params, "
                f"{m['train_seconds']:.0f} s training")


def _sets(items: list[str]) -> dict:
    """``--set``, parsed and checked; refused where its records would land among the project's
    own (a checkout's results/): a run with other settings is another run."""
    from reproduce import paths
    from reproduce.config import parse_sets
    from reproduce.errors import ConfigError

    sets = parse_sets(items)
    if sets and paths.REPO is not None and paths.results_dir() == paths.REPO / "results":
        raise ConfigError("--set changes what the runs are: keep their records apart from the "
                          "project's with --results DIR (e.g. --results my-results)")
    return sets


def _print_params(table: str, vocab_size: int, as_json: bool) -> None:
    import json

    from reproduce.config import ModelConfig, model_items
    from reproduce.records.sweep import load_spec
    from reproduce.tables.params import parameter_rows

    rows = parameter_rows(load_spec(table), vocab_size)
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    print(f"Table 3 parameter counts at the paper's sizes, shared vocabulary {vocab_size} "
          "(tied source/target/softmax embedding; biases and LayerNorms included).")
    print("The paper's column fits a tied vocabulary of about 41000 better than 37000 "
          "(--vocab-size 41000 to compare).\n")
    # the model's shape fields (config.model_items), the vocabulary said above
    shape = [name for name, _ in model_items(ModelConfig(), ("shape",)) if name != "vocab_size"]
    width = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in shape}
    print(f"{'variant':8} " + " ".join(f"{k:>{width[k]}}" for k in shape)
          + f" {'ours (M)':>9} {'paper (M)':>9}")
    for r in rows:
        paper = "" if r["paper_params_m"] is None else f"{r['paper_params_m']:>9}"
        print(f"{r['variant']:8} " + " ".join(f"{r[k]:>{width[k]}}" for k in shape)
              + f" {r['params'] / 1e6:>9.1f} {paper:>9}")


def _overridden_line(spec, scale: str) -> None:
    """Say where the scale replaces a value the spec's base set (the record keeps both)."""
    if overridden := spec.scale_overrides(scale):
        print(f"  scale `{scale}` replaces the spec's base: " + ", ".join(
            f"{k} {v['spec']} -> {v['scale']}" for k, v in overridden.items())
            + " (a scale sets these for every run; recorded as scale_overrode)")
    if line := spec.over_scale_line(scale):
        print(line)


def _check_cluster_options(args: argparse.Namespace) -> None:
    """The cluster's options mean nothing to a local sweep: one line, not silently ignored."""
    from reproduce.errors import ConfigError

    given = [name for name, value in (("--slurm", args.slurm), ("--partition", args.partition),
                                      ("--nodes", args.nodes != 1),
                                      ("--gpus-per-node", args.gpus is not None)) if value]
    if given and args.launcher != "slurm":
        raise ConfigError(f"{', '.join(given)}: for --launcher slurm only (a local sweep trains "
                          "on this machine: --devices and --workers say how)")
    if args.on and args.launcher != "slurm" and not args.dry_run:
        raise ConfigError(f"--on {args.on}: a local sweep trains on this machine; --on plans for "
                          "other hardware with --dry-run, or sizes time limits with --launcher "
                          "slurm")


def _options(args: argparse.Namespace):
    """The launching arguments, as ``launch_table`` takes them."""
    from reproduce.launch.options import Options

    return Options(render=args.render, dry_run=args.dry_run, launcher=args.launcher, on=args.on,
                   accelerator=args.accelerator, devices=args.devices, workers=args.workers,
                   trials=args.trials, storage=args.storage, nodes=args.nodes, gpus=args.gpus,
                   partition=args.partition, slurm=tuple(args.slurm))
