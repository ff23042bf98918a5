"""Figures drawn from run records (PNG, beside the Markdown tables in ``results/``).

Like the tables, pure functions of the records. Table 3: per row, each variant's change
from base, the paper's beside ours (relative, so a 5-PPL model and a 37-PPL one share an axis),
with our noise and the verdict. Table 2: BLEU against parameters. Both: the learning curves
every record carries.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from reproduce.records.metrics import COMPARED
from reproduce.records.schema import Record
from reproduce.records.sweep import Spec
from reproduce.tables.common import mean_paper_flops
from reproduce.tables.table3 import compare_to_base


# matplotlib is imported when a figure is drawn: 1.0 s that status and --dry-run never need.
def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen
    import matplotlib.pyplot as plt

    return plt


def _by_scale(records: list[Record]) -> dict[str, list[Record]]:
    out: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        out[r["scale"]].append(r)
    return out


def plot_table(spec: Spec, records: list[Record], directory: Path) -> list[Path]:
    """The figures of a table, per scale with records; returns the files written. Table 3:
    ``table3-<scale>.png`` (changes from base, ``plot_changes``, once a row has run) and
    ``table3-<scale>-curves.png``; Table 2: ``table2-<scale>.png`` (BLEU against parameters,
    and the curves); Table 4: none. Which of these is the spec's ``kind``."""
    if spec.kind == "table4":
        return []
    if spec.kind == "table2":
        return _plot_bleu_params(spec, records, directory)
    written = []
    for scale, recs in sorted(_by_scale(records).items()):
        changes = directory / f"{spec.table}-{scale}.png"
        if rows_with_runs(spec, recs) != [("base", [])]:
            written.append(plot_changes(spec, recs, changes, scale))
        else:  # base alone has no change to draw; one drawn before its rows' records went is gone
            changes.unlink(missing_ok=True)
        written.append(_plot_curves(spec, recs, directory / f"{spec.table}-{scale}-curves.png",
                                    scale))
    return written


VERDICT_MARKS = {"yes": "✓ agrees", "no": "✗ opposite", "no effect": "≈ within noise",
                 "better": "↑ better than base", "worse": "↓ worse than base",
                 "n/a": "? no verdict"}


def plot_changes(spec: Spec, records: list[Record], path: Path, scale: str) -> Path:
    """One panel per row that has run (A, B, ...; ``rows_with_runs``) and metric (PPL left,
    BLEU right): each variant's change from base in % of base, the paper's (grey) above ours
    (colour, mean over seeds; error bar: the 95% interval of the difference, as the verdict
    uses), the verdict at the right. The title names the rows left out."""
    plt = pyplot()
    runs: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        runs[r["variant"]].append(r)
    shown = dict(rows_with_runs(spec, records))
    rows = [(row, [n for n in names if n in spec.variants]) for row, names in shown.items()]
    unrun = [row for row in spec.rows_at(scale) if row not in shown]
    heights = [max(1, len(names)) for _, names in rows]
    fig, axes = plt.subplots(len(rows), 2, figsize=(12, 1.2 + 0.62 * sum(heights)),
                             squeeze=False, gridspec_kw={"height_ratios": heights})
    for m, metric in enumerate(COMPARED):
        key, paper_key, label = metric.key, metric.paper_key or "", metric.label
        base_ours = [r["metrics"][key] for r in runs.get("base", [])]
        base_paper = spec.variants["base"].paper.get(paper_key) if "base" in spec.variants else None
        for k, (row, names) in enumerate(rows):
            ax = axes[k][m]
            ax.axvline(0, color="black", linewidth=0.6)
            for i, name in enumerate(names):
                paper = spec.variants[name].paper.get(paper_key)
                if paper is not None and base_paper:
                    ax.barh(i - 0.2, 100 * (paper - base_paper) / base_paper, 0.38, color="0.65",
                            label="paper")
                ours = [r["metrics"][key] for r in runs.get(name, [])]
                judged = compare_to_base(spec, runs, name, metric)
                verdict = judged.verdict
                mark = "no run"
                if ours and base_ours and not statistics.mean(base_ours):
                    mark = "base is 0: no relative change"
                elif ours and base_ours:
                    b = statistics.mean(base_ours)
                    err = 100 * judged.noise.half_width / b if judged.noise else None
                    ax.barh(i + 0.2, 100 * (statistics.mean(ours) - b) / b, 0.38, xerr=err,
                            capsize=3, color=f"C{m}", label="ours")
                    flat = verdict == "no" and paper is not None and paper == base_paper
                    mark = f"{'✗ paper: no change' if flat else VERDICT_MARKS[verdict]} " \
                           f"(n={len(ours)})"
                ax.annotate(mark, (1.01, i), xycoords=("axes fraction", "data"), va="center",
                            fontsize=7)
            ax.set_yticks(range(len(names)), names, fontsize=8)
            ax.margins(x=0.08)
            ax.invert_yaxis()
            ax.set_title(f"({row}) {label}", fontsize=9, loc="left")
            ax.tick_params(axis="x", labelsize=7)
        axes[-1][m].set_xlabel(f"change from base, % of base {label} "
                               + ("(right is worse)" if metric.lower_is_better
                                  else "(right is better)"),
                               fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    fig.legend(unique.values(), unique.keys(), loc="upper right", fontsize=8)
    n_base = len(runs.get("base", []))
    fig.suptitle(f"{spec.table} at scale `{scale}`: each variant's change from base, the paper's "
                 f"(grey) and ours (colour; error bar: our noise, seeds and sentences, 95% "
                 f"interval; base n={n_base})"
                 + (f"\nnot run at this scale: row{'s' if len(unrun) > 1 else ''} "
                    f"{', '.join(unrun)}" if unrun else ""), fontsize=10, x=0.45)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.subplots_adjust(wspace=0.45)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def rows_with_runs(spec: Spec, records: list[Record]) -> list[tuple[str, list[str]]]:
    """The rows with a run of their own among ``records`` (base is drawn in each), or base alone
    when none has one: a panel of base's curve alone, or of the paper's bars alone, says nothing
    of ours (the table lists what has not run)."""
    ran = {r["variant"] for r in records}
    return [(row, names) for row, names in spec.rows.items() if ran & set(names)] or [("base", [])]


def _plot_curves(spec: Spec, records: list[Record], path: Path, scale: str) -> Path:
    """Dev PPL during training, one line per run, one panel per row of ``rows_with_runs``."""
    plt = pyplot()
    rows = rows_with_runs(spec, records)
    # one panel (a scale that runs one row) still needs the width of its title
    fig, axes = plt.subplots(1, len(rows), figsize=(max(5.5, 3.2 * len(rows)), 3.6),
                             squeeze=False, sharey=True)
    for ax, (row, names) in zip(axes[0], rows, strict=True):
        colour = {"base": "black", **{name: f"C{i}" for i, name in enumerate(names)}}
        seeds = defaultdict(list)  # a colour per variant, its seeds alike: one legend entry
        for r in sorted(records, key=lambda r: (r["variant"], r["seed"])):
            if r["variant"] in colour and r.get("curve", {}).get("dev_ppl"):
                seeds[r["variant"]].append(r)
        for name, runs in seeds.items():
            for k, r in enumerate(runs):
                curve = r["curve"]["dev_ppl"]
                ax.plot([c[0] for c in curve], [c[2] for c in curve], marker=".",
                        color=colour[name], linewidth=0.8,
                        label=f"{name} (seed{'s' if len(runs) > 1 else ''} "
                        f"{', '.join(str(x['seed']) for x in runs)})" if k == 0 else None)
        ax.set(title=f"({row})", xlabel="step", yscale="log")
        if ax.lines:
            ax.legend(fontsize=6)
    axes[0][0].set_ylabel("dev PPL")
    fig.suptitle(f"{spec.table} at scale `{scale}`: dev PPL during training", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _paper_points(spec: Spec) -> list[tuple[str, str, float, float]]:
    """(model, en_de or en_fr, training FLOPs, BLEU) of every row Table 2 cites, the
    Transformer's included, as the paper gives them."""
    return [(row["model"], lang, row[f"flops_{lang}"], row[f"bleu_{lang}"]) for row in spec.cited
            for lang in ("en_de", "en_fr") if row.get(f"bleu_{lang}") and row.get(f"flops_{lang}")]


def _plot_bleu_params(spec: Spec, records: list[Record], directory: Path) -> list[Path]:
    """Table 2: test BLEU (the paper's convention) against training cost (the paper's method), ours
    (mean over seeds, error bars = std) beside the paper's systems, and the dev-PPL curves."""
    plt = pyplot()
    written = []
    marks = {"en_de": "o", "en_fr": "^"}
    for scale, recs in sorted(_by_scale(records).items()):
        per_variant: dict[str, list[Record]] = defaultdict(list)
        for r in recs:
            per_variant[r["variant"]].append(r)
        fig, (ax_bleu, ax_paper, ax_curve) = plt.subplots(1, 3, figsize=(16, 4.8))
        for name, runs in per_variant.items():
            bleu = [r["metrics"]["test_bleu_tokenized"] for r in runs]
            lang = name.split("-", 1)[-1].replace("-", "_")
            if (cost := mean_paper_flops(runs)) is not None:  # None: a device of unknown peak
                std = statistics.stdev(bleu) if len(bleu) > 1 else 0
                ax_bleu.errorbar(cost, statistics.mean(bleu), yerr=std,
                                 fmt=marks.get(lang, "o"), capsize=3)
                ax_bleu.annotate(f"{name} (n={len(runs)})", (cost, statistics.mean(bleu)),
                                 textcoords="offset points", xytext=(4, 4), fontsize=8)
            for r in runs:
                curve = r.get("curve", {}).get("dev_ppl") or []
                if curve:
                    ax_curve.plot([c[0] for c in curve], [c[2] for c in curve], marker=".",
                                  label=f"{name} s{r['seed']}")
        for model, lang, flops, paper_bleu in _paper_points(spec):
            ax_paper.plot(flops, paper_bleu, marks[lang],
                          color="black" if model.startswith("Transformer") else "grey")
            ax_paper.annotate(model, (flops, paper_bleu), textcoords="offset points", xytext=(3, 3),
                              fontsize=6)
        for ax, title in ((ax_bleu, f"ours, scale `{scale}` (o EN-DE, ^ EN-FR)"),
                          (ax_paper, "paper: WMT14 newstest2014 (o EN-DE, ^ EN-FR)")):
            ax.set(title=title, xlabel="training cost, the paper's method (FLOPs)",
                   ylabel="test BLEU (tokenized)", xscale="log")
        ax_curve.set(title="ours: dev PPL during training", xlabel="step", ylabel="dev PPL",
                     yscale="log")
        if ax_curve.lines:
            ax_curve.legend(fontsize=7, ncol=2)
        fig.suptitle(f"{spec.table}: {spec.caption}", fontsize=10)
        fig.tight_layout()
        path = directory / f"{spec.table}-{scale}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


