"""Records in, Markdown tables out. Pure functions of the records; nothing here trains or edits."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from .sweep import Spec

CORPUS_NOTES = {
    "bible-en-de": "Bible EN-DE (World English Bible -> Elberfelder 1905, split by whole books; "
                   "dev = Ruth, Esther, Jonah, Philippians, James, 1 Peter; test = Acts, Romans). "
                   "**Not comparable with WMT numbers.**",
    "bible-en-fr": "Bible EN-FR (World English Bible -> Louis Segond 1910, split by whole books). "
                   "**Not comparable with WMT numbers.**",
    "wmt14-en-de": "WMT14 EN-DE (newstest2013 dev, newstest2014 test), as the paper.",
    "wmt14-en-fr": "WMT14 EN-FR (newstest2013 dev, newstest2014 test), as the paper.",
}
# Table 3's columns, in the paper's order: (header, config section, field).
SHAPE_COLUMNS = [("N", "model", "N"), ("d_model", "model", "d_model"), ("d_ff", "model", "d_ff"),
                 ("h", "model", "h"), ("d_k", "model", "d_k"), ("d_v", "model", "d_v"),
                 ("P_drop", "model", "p_drop"), ("eps_ls", "train", "eps_ls"),
                 ("train steps", "train", "train_steps")]


def load_records(table: str, results: Path) -> list[dict[str, Any]]:
    """Every finished run's record for one table (files that fail to parse are reported)."""
    records = []
    for path in sorted((results / table).glob("*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not a valid record ({e})") from None
    return records


def _mean_std(values: list[float], digits: int) -> str:
    if not values:
        return ""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return (f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f} "
            f"(n={len(values)})")


def _params(values: list[int]) -> str:
    if not values:
        return ""
    millions = values[0] / 1e6
    return f"{millions:.0f}" if millions >= 10 else f"{millions:.2f}"


def _shape_cells(spec: Spec, variant: str) -> list[str]:
    """The cells the paper prints: all of base's, only the overridden ones for a variant."""
    base = spec.resolve("base", "paper") if "base" in spec.variants else None
    overrides = spec.variants[variant].overrides
    cells = []
    for _, section, name in SHAPE_COLUMNS:
        if variant == "base" or name in overrides:
            value = getattr(getattr(spec.resolve(variant, "paper"), section), name)
            cells.append(f"{value // 1000}K" if name == "train_steps" else str(value))
        elif base is not None:
            cells.append("")
    if "positions" in overrides:
        cells[0] = f"{overrides['positions']} positions"
        cells[1:] = [""] * (len(cells) - 1)
    return cells


def render_table3(spec: Spec, records: list[dict[str, Any]]) -> str:
    """The paper's Table 3 with our PPL, BLEU and params beside its own, one table per scale."""
    lines = [f"# Table 3: {spec.caption}", "",
             "Rendered by `python -m reproduce table3` from the run records in "
             "`results/table3/`; never edited by hand. *paper* columns are the paper's published "
             "figures (EN-DE newstest2013 dev); *ours* come from our runs. Empty cells: no record.",
             ""]
    by_scale: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_scale[r["scale"]].append(r)
    if not by_scale:
        lines.append("No runs recorded yet.")
    for scale in sorted(by_scale, key=lambda s: list(spec.scales).index(s)
                        if s in spec.scales else 99):
        lines += _scale_table(spec, scale, by_scale[scale])
    return "\n".join(lines) + "\n"


def _scale_table(spec: Spec, scale: str, records: list[dict[str, Any]]) -> list[str]:
    sc = spec.scales.get(scale)
    runs = defaultdict(list)
    for r in records:
        runs[r["variant"]].append(r)
    corpora = sorted({r["data"]["corpus"] for r in records})
    signatures = sorted({r["bleu"]["dev"]["sacrebleu"]["signature"] for r in records})
    out = [f"## Scale `{scale}`", "", _scale_note(sc, "the cells below are the paper's"), "",
            "Corpus: " + " ".join(CORPUS_NOTES.get(c, c) for c in corpora),
            f"BLEU: sacreBLEU on detokenized output, beam search as the paper; signature "
            f"`{'`, `'.join(signatures)}`. PPL: per word-piece on the dev split, our BPE "
            "vocabulary. Hardware: " + _hardware(records) + ".", ""]
    header = [""] + [h for h, _, _ in SHAPE_COLUMNS] + [
        "PPL (dev) paper", "PPL (dev) ours", "BLEU (dev) paper", "BLEU (dev) ours",
        "BLEU (test) ours", "params ×10⁶ paper", "params ×10⁶ ours"]
    out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    groups = [("base", ["base"])] + list(spec.rows.items())
    for row, names in groups:
        for i, name in enumerate(n for n in names if n in spec.variants):
            paper, ours = spec.variants[name].paper, runs.get(name, [])
            label = (f"({row})" if row != "base" else "base") if i == 0 else ""
            metric = [[r["metrics"][k] for r in ours] for k in ("dev_ppl", "dev_bleu", "test_bleu")]
            cells = [label] + _shape_cells(spec, name) + [
                _fmt(paper.get("ppl")), _mean_std(metric[0], 2), _fmt(paper.get("bleu")),
                _mean_std(metric[1], 1), _mean_std(metric[2], 1), _fmt(paper.get("params_m")),
                _params([r["metrics"]["params"] for r in ours])]
            out.append("| " + " | ".join(cells) + " |")
    out += ["", f"{sum(len(v) for v in runs.values())} runs recorded at this scale; commands and "
            "configs are in each record.", ""]
    return out


def _fmt(value: Any) -> str:
    return "" if value is None else str(value)


def _hardware(records: list[dict[str, Any]]) -> str:
    return "; ".join(sorted({r["hardware"]["cpu"] if not r["hardware"]["gpus"]
                             else f"{len(r['hardware']['gpus'])}x {r['hardware']['gpus'][0]}"
                             for r in records}))


def _scale_note(sc, what: str) -> str:
    if sc is None:
        return ""
    return (f"{sc.about}. Widths x{sc.width:g} and steps x{sc.steps:g} of the paper's ({what}; "
            "every variant is resized by the same factors).")


def _sci(value: float | None) -> str:
    return "" if value is None else f"{value:.1e}"


# --- Table 2 ---------------------------------------------------------------------------------------

LANGS = ("en_de", "en_fr")


def render_table2(spec: Spec, records: list[dict[str, Any]]) -> str:
    """The paper's Table 2 with our Transformer rows added, then the details of our runs.

    In the main table our BLEU is the paper's convention (tokenized, compound-split) and our cost
    the paper's method; sacreBLEU and the counted FLOPs sit in the details table, labelled."""
    lines = [f"# Table 2: {spec.caption}", "",
             "Rendered by `python -m reproduce table2` from the run records in `results/table2/`; "
             "never edited by hand. Rows without *ours* are the paper's published figures as "
             "it cites them.", "",
             "| Model | BLEU EN-DE | BLEU EN-FR | Training cost EN-DE (FLOPs) | "
             "Training cost EN-FR (FLOPs) |", "|---|---|---|---|---|"]
    for row in spec.cited:
        lines.append(f"| {row['model']} | {_fmt(row.get('bleu_en_de'))} | "
                     f"{_fmt(row.get('bleu_en_fr'))} | {_sci(row.get('flops_en_de'))} | "
                     f"{_sci(row.get('flops_en_fr'))} |")
    by_scale: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_scale[r["scale"]].append(r)
    details = []
    for scale, recs in by_scale.items():
        for size in ("base", "big"):
            cells = {}
            for r in recs:
                if r["variant"].startswith(size + "-"):
                    lang = r["variant"].split("-", 1)[1].replace("-", "_")
                    cells[lang] = r
            if not cells:
                continue
            bleu = [_mean_std([c["metrics"]["test_bleu_tokenized"]], 2) if (c := cells.get(lang))
                    else "" for lang in LANGS]
            cost = [_sci(c["cost"]["paper_method_flops"]) if (c := cells.get(lang)) else ""
                    for lang in LANGS]
            lines.append(f"| Transformer ({size}), ours, scale `{scale}` | {bleu[0]} | {bleu[1]} | "
                         f"{cost[0]} | {cost[1]} |")
        details += _table2_details(spec, scale, recs)
    lines += ["", "Our BLEU above is the paper's convention: Moses-tokenized, compound-split "
              "(`##AT##-##AT##`), 4-gram corpus BLEU as multi-bleu computes it, on the test split "
              "after checkpoint averaging. Our cost above is the paper's method: training time x "
              "devices x sustained TFLOPS per device.", ""]
    if not records:
        lines.append("No runs recorded yet.")
    return "\n".join(lines + details) + "\n"


def _table2_details(spec: Spec, scale: str, records: list[dict[str, Any]]) -> list[str]:
    corpora = sorted({r["data"]["corpus"] for r in records})
    out = [f"## Our runs at scale `{scale}`", "", _scale_note(spec.scales.get(scale), "model "
           "sizes as named"), "", "Corpus: " + " ".join(CORPUS_NOTES.get(c, c) for c in corpora),
           f"Hardware: {_hardware(records)}.", "",
           "| variant | tokenized BLEU (paper's convention) | sacreBLEU | cost, paper's method "
           "(FLOPs) | cost, counted (FLOPs) | training time | devices x TFLOPS | tokens/step "
           "(effective) | checkpoints averaged |", "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(records, key=lambda r: list(spec.variants).index(r["variant"])
                    if r["variant"] in spec.variants else 99):
        cost, m, batch = r["cost"], r["metrics"], r["batch"]
        out.append(
            f"| {r['variant']} (seed {r['seed']}) | {m['test_bleu_tokenized']:.2f} | "
            f"{m['test_bleu']:.2f} | {_sci(cost['paper_method_flops'])} | "
            f"{_sci(cost['analytic_flops'])} | {m['train_seconds'] / 3600:.2f} h | "
            f"{cost['devices']} x {cost['tflops_per_device']} ({cost['tflops_source']}) | "
            f"{batch['effective_tokens_per_step']} ({batch['accumulate']} accumulated) | "
            f"{len(r['averaged_checkpoints']) or 'none'} |")
    signatures = sorted({r["bleu"]["test"]["sacrebleu"]["signature"] for r in records}
                        | {r["bleu"]["test"]["tokenized"]["signature"] for r in records})
    out += ["", "Signatures: " + "; ".join(f"`{s}`" for s in signatures), ""]
    return out


RENDERERS = {"table2": render_table2, "table3": render_table3}
