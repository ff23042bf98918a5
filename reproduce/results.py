"""Records in, Markdown tables out. Pure functions of the records; nothing here trains or edits."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from .devices import DEVICE_NAMES
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


def _corpus_note(records: list[dict[str, Any]]) -> str:
    """What the runs were trained on: a shipped corpus by its note; local files (``data_dir``)
    as what they are, whatever the spec called them."""
    notes = []
    for corpus in sorted({r["data"]["corpus"] for r in records if not r["data"].get("files")}):
        notes.append(CORPUS_NOTES.get(corpus, corpus))
    local = {(r["data"]["corpus"], r["data"]["data_dir"], json.dumps(r["data"]["files"])): r
             for r in records if r["data"].get("files")}
    for (corpus, where, _), r in sorted(local.items()):
        d = r["data"]
        sizes = ", ".join(f"{split} {d[f'{split}_pairs']} pairs (sha256 "
                          f"{d['files'][split]['sha256'][:12]})" for split in ("dev", "test"))
        called = ("" if corpus.startswith("local-") else
                  f" The spec calls it `{corpus}`; these files were not checked to be that "
                  "corpus, so the paper's numbers beside them compare with other data.")
        notes.append(f"local files in `{where}` ({corpus.split('-', 1)[-1].upper()}: train "
                     f"{d['train_pairs']} pairs used (sha256 {d['files']['train']['sha256'][:12]}),"
                     f" {sizes}).{called}")
    return " ".join(notes)


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


def _configuration(spec: Spec, variant: str) -> str:
    """The paper's settings of a variant as one cell (at the paper's sizes): all of base's, only
    what a variant changes otherwise (the paper's layout: unlisted values equal base)."""
    headers = [h for h, _, _ in SHAPE_COLUMNS]
    cells = _shape_cells(spec, variant)
    if cells and cells[0].endswith(" positions"):
        return cells[0]
    return ", ".join(f"{h} {c}" if h != "train steps" else f"{c} steps"
                     for h, c in zip(headers, cells, strict=False) if c)


def _scale_table(spec: Spec, scale: str, records: list[dict[str, Any]]) -> list[str]:
    sc = spec.scales.get(scale)
    runs = defaultdict(list)
    for r in records:
        runs[r["variant"]].append(r)
    signatures = sorted({r["bleu"]["dev"]["sacrebleu"]["signature"] for r in records})
    out = [f"## Scale `{scale}`", "", _scale_note(sc, "the configurations below are the paper's"),
           ""]
    header = ["", "configuration (paper's sizes)", "PPL paper", "PPL ours", "ΔPPL paper / ours",
              "BLEU paper", "BLEU ours", "ΔBLEU paper / ours", "verdict PPL; BLEU"]
    out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    details = ["| | seeds | BLEU (test) ours | params ×10⁶ paper / ours | our d_model, d_ff, h, "
               "d_k, d_v | training hours (each) |", "|---|---|---|---|---|---|"]
    groups = [("base", ["base"])] + list(spec.rows.items())
    tally: dict[str, Counter[str]] = {"PPL": Counter(), "BLEU": Counter()}
    for row, names in groups:
        for i, name in enumerate(n for n in names if n in spec.variants):
            paper, ours = spec.variants[name].paper, runs.get(name, [])
            label = name if row == "base" or i else f"({row}) {name}"
            metric = [[r["metrics"][k] for r in ours] for k in ("dev_ppl", "dev_bleu", "test_bleu")]
            verdicts = [compare_to_base(spec, runs, name, key, paper_key)
                        for key, paper_key in (("dev_ppl", "ppl"), ("dev_bleu", "bleu"))]
            for v in verdicts:
                tally[v.metric][v.verdict] += name != "base"
            delta = ["" if name == "base" else f"{v.paper_cell or '–'} / {v.ours_cell or '–'}"
                     for v in verdicts]
            cells = [label, _configuration(spec, name), _fmt(paper.get("ppl")),
                     _mean_std(metric[0], 2), delta[0], _fmt(paper.get("bleu")),
                     _mean_std(metric[1], 1), delta[1],
                     "" if name == "base" else "; ".join(v.verdict for v in verdicts)]
            out.append("| " + " | ".join(cells) + " |")
            if ours:
                m = ours[0]["config"]["model"]
                details.append(
                    f"| {name} | {', '.join(str(r['seed']) for r in ours)} | "
                    f"{_mean_std(metric[2], 1)} | {_fmt(paper.get('params_m')) or '–'} / "
                    f"{_params([r['metrics']['params'] for r in ours])} | "
                    f"{m['d_model']}, {m['d_ff']}, {m['h']}, {m['d_k']}, {m['d_v']} | "
                    + ", ".join(f"{r['metrics']['train_seconds'] / 3600:.2f}" for r in ours)
                    + " |")
    out += [""]
    for metric, counts in tally.items():
        judged = sum(counts[k] for k in ("yes", "no", "no effect"))
        out.append(f"- {metric}: {counts['yes']} of {judged} variants with a verdict change in the "
                   f"paper's direction; {counts['no']} go the other way; {counts['no effect']} "
                   f"change by less than our seed noise; {counts['n/a']} have no verdict (no "
                   "record of them or of base at this scale, or one seed, which gives no noise "
                   "estimate).")
    out += ["", "PPL and BLEU are on the dev split; ours are mean ± std (n seeds). Δ: change from "
            "base (variant − base), the paper's / ours, with our seed noise (±: 2 standard errors "
            "of the difference of means). *verdict*: `yes` when our change has the paper's sign "
            "and exceeds that noise; `no` when it exceeds it with the other sign; `no effect` "
            "when it is within it; `n/a` with fewer than 2 seeds of either.", "",
            "Corpus: " + _corpus_note(records),
            f"BLEU: sacreBLEU on detokenized output, beam search as the paper; signature "
            f"`{'`, `'.join(signatures)}`. PPL: per word-piece on the dev split, our BPE "
            "vocabulary.", *_reference_line(records), *_devices_line(records),
            _cost_line(records), "",
            f"Details of our {sum(len(v) for v in runs.values())} runs (commands and configs are "
            "in each record):", "", *details, ""]
    return out


def _cost_line(records: list[dict[str, Any]]) -> str:
    """What the table's runs took, and where: worker-hours per CPU or GPU kind, with the CPU
    flags that decide its speed (our machines differ)."""
    by_where: dict[str, list[float]] = defaultdict(list)
    for r in records:
        h = r["hardware"]
        if h.get("gpus"):
            where = f"{len(h['gpus'])}x {h['gpus'][0]}"
        else:
            flags = set(h.get("cpu_flags") or [])
            known = ", ".join(f for f in ("avx2", "avx512f", "avx512_bf16") if f in flags)
            amx = "AMX" if any(f.startswith("amx") for f in flags) else "no AMX"
            where = (f"{h['cpu']} ({known}, {amx}; {h.get('torch_threads', '?')} thread(s))"
                     if flags else f"{h['cpu']} (flags not recorded)")
        by_where[where].append(r["metrics"]["train_seconds"] * r.get("cost", {}).get("devices", 1))
    return "Cost: " + "; ".join(f"{sum(v) / 3600:.1f} worker-hours of training for {len(v)} runs "
                                f"on {where}" for where, v in sorted(by_where.items())) + "."


def _reference_line(records: list[dict[str, Any]]) -> list[str]:
    """What count models score on the same dev pieces: a run near them has not learned to
    translate yet (records from before these were kept have none)."""
    refs = {json.dumps(r["data"]["reference_ppl"], sort_keys=True) for r in records
            if r["data"].get("reference_ppl")}
    if len(refs) != 1:  # none recorded, or vocabularies differ between runs
        return []
    ref = json.loads(refs.pop())
    return [f"Reference points for PPL, on the same dev pieces: a unigram model of the training "
            f"targets scores {ref['unigram']:.1f}, an interpolated bigram model {ref['bigram']:.1f} "
            "(`data.ngram_perplexities`); a run near these has learned target-side statistics, "
            "not yet to translate."]


@dataclass(frozen=True)
class Verdict:
    metric: str
    paper_cell: str
    ours_cell: str
    verdict: str  # yes | no | no effect | n/a


def compare_to_base(spec: Spec, runs: dict[str, list[dict[str, Any]]], variant: str, key: str,
                    paper_key: str) -> Verdict:
    """Our change from base beside the paper's, and whether the two agree in sign.

    A change inside our seed noise (2 standard errors of the difference of the two means) is
    "no effect", never agreement; with fewer than two seeds on either side there is no noise
    estimate and no verdict."""
    metric = {"ppl": "PPL", "bleu": "BLEU"}[paper_key]
    paper_v, paper_b = (spec.variants[n].paper.get(paper_key) if n in spec.variants else None
                        for n in (variant, "base"))
    paper_delta = None if paper_v is None or paper_b is None else paper_v - paper_b
    ours_v = [r["metrics"][key] for r in runs.get(variant, [])]
    ours_b = [r["metrics"][key] for r in runs.get("base", [])]
    if variant == "base" or not ours_v or not ours_b:
        return Verdict(metric, "" if variant == "base" else _signed(paper_delta), "", "n/a")
    delta = statistics.mean(ours_v) - statistics.mean(ours_b)
    if len(ours_v) < 2 or len(ours_b) < 2 or paper_delta is None:
        return Verdict(metric, _signed(paper_delta), _signed(delta), "n/a")
    noise = 2 * math.sqrt(statistics.variance(ours_v) / len(ours_v)
                          + statistics.variance(ours_b) / len(ours_b))
    if abs(delta) <= noise:
        verdict = "no effect"
    else:
        verdict = "yes" if paper_delta != 0 and (delta > 0) == (paper_delta > 0) else "no"
    return Verdict(metric, _signed(paper_delta), f"{_signed(delta)} (±{noise:.2f})", verdict)


def _signed(value: float | None) -> str:
    return "" if value is None else f"{value:+.2f}"


def _fmt(value: Any) -> str:
    return "" if value is None else str(value)


def _layouts(records: list[dict[str, Any]]) -> str:
    """How the runs were spread over devices: devices x accumulation x micro-batch = tokens/step
    (records made before layouts were recorded trained on one device)."""
    counts: dict[str, int] = defaultdict(int)
    for r in records:
        b = r.get("batch") or {}
        if not {"accumulate", "device_batch_tokens", "effective_tokens_per_step"} <= set(b):
            continue  # a record without its batch layout says nothing here
        n = b.get("world_size", b.get("devices", 1))
        one, many = DEVICE_NAMES[b.get("accelerator", "cpu")]
        counts[f"{n} {many + ' (DDP)' if n > 1 else one} x {b['accumulate']} accumulated x "
               f"{b['device_batch_tokens']} tokens = {b['effective_tokens_per_step']} tokens per "
               "step"] += 1
    return "; ".join(f"{k} ({v} run{'s' if v > 1 else ''})" for k, v in sorted(counts.items()))


def _devices_line(records: list[dict[str, Any]]) -> list[str]:
    layouts = _layouts(records)
    return [f"Devices: {layouts}."] if layouts else []


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
    out = [f"## Our runs at scale `{scale}`", "", _scale_note(spec.scales.get(scale), "model "
           "sizes as named"), "", "Corpus: " + _corpus_note(records),
           f"Hardware: {_hardware(records)}.", *_devices_line(records), "",
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


# --- Table 4 ---------------------------------------------------------------------------------------

TREEBANKS = {"nltk-sample": "NLTK WSJ sample", "wsj": "WSJ"}


# Table 4's target formats (data.linearization; records from before the field used XX).
TARGETS = {"tags": "POS-tag targets", "xx": "XX targets", "words": "word targets (not the paper's)"}


def _settings(record: dict[str, Any]) -> str:
    tuning = record.get("tuning")
    targets = TARGETS[record["config"]["data"].get("linearization", "xx")]
    return (f"tuned on dev ({tuning['n_trials']} trials)" if tuning else "untuned") + f", {targets}"


def render_table4(spec: Spec, records: list[dict[str, Any]]) -> str:
    """The paper's Table 4 (every cited parser, its training data and F1) with our rows under the
    paper's Transformer rows, then the details of our runs, by scale and treebank."""
    from .data import missing_input

    lines = [f"# Table 4: {spec.caption}", "",
             "Rendered by `python -m reproduce table4` from the run records in `results/table4/`; "
             "never edited by hand. Rows without *ours* are the published figures as the paper "
             "cites them (WSJ section 23).", "",
             "| Parser | Training | WSJ 23 F1 |", "|---|---|---|"]
    ours: dict[str, dict[tuple[str, str, str], list[dict[str, Any]]]] = defaultdict(dict)
    for r in records:
        key = (r["scale"], r["treebank"]["kind"], _settings(r))
        ours[r["variant"]].setdefault(key, []).append(r)
    for row in spec.cited:
        lines.append(f"| {row['parser']} | {row['training']} | {_fmt(row.get('f1'))} |")
        variants = row.get("ours") or []
        variants = [variants] if isinstance(variants, str) else variants
        if variants and not any(ours.get(v) for v in variants):
            variant = variants[0]
            corpus = spec.resolve(variant, "paper").data.corpus if variant in spec.variants else ""
            why = missing_input(corpus, None) if corpus else None
            lines.append(f"| {row['parser']}, ours | {row['training']} | not run"
                         + (" (no semi-supervised corpus given: `--silver PATH`)" if why else "")
                         + " |")
        for variant in variants:
            for (scale, kind, settings), recs in ours.get(variant, {}).items():
                f1 = _mean_std([r["metrics"]["test_f1"] for r in recs], 1)
                where = "the sample's test files" if kind == "nltk-sample" else "section 23"
                lines.append(f"| {row['parser']}, ours, scale `{scale}`, "
                             f"{TREEBANKS.get(kind, kind)}, {settings} | {row['training']} | "
                             f"{f1} ({where}) |")
    lines += ["", "Our F1: labelled bracketing F1 on the test split, EVALB COLLINS.prm conventions "
              "(function tags stripped, PRT = ADVP, punctuation and the root not counted), model "
              "output repaired into a tree over the input words and given the gold POS tags. On "
              "NLTK's 10% WSJ sample (3,914 sentences, split by file) the training set is ~13x "
              "smaller than sections 02-21 and the test files are not section 23: **those F1 are "
              "not comparable with the paper's**.", ""]
    if not records:
        lines.append("No runs recorded yet.")
    by_data: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_data[(r["scale"], r["treebank"]["kind"])].append(r)
    for (scale, kind), recs in by_data.items():
        lines += _table4_details(spec, scale, kind, recs)
    return "\n".join(lines) + "\n"


def _table4_details(spec: Spec, scale: str, kind: str, records: list[dict[str, Any]]) -> list[str]:
    first = records[0]
    out = [f"## Our runs at scale `{scale}` on the {TREEBANKS.get(kind, kind)}", "",
           _scale_note(spec.scales.get(scale), "model sizes as named"), "",
           f"Data: {first['treebank']['about']}"
           + (f" ({first['treebank']['path']})" if first["treebank"].get("path") else "") + ". "
           f"Hardware: {_hardware(records)}.", "",
           "| run | settings | dev P | dev R | dev F1 | test P | test R | test F1 | sentences "
           "(dev, test) | well-formed outputs (test) | dev PPL | vocabulary | params ×10⁶ | steps "
           "| training time | beam, alpha, max length |", "|" + "---|" * 16]
    for r in sorted(records, key=lambda r: r["run_id"]):
        m, c, ev = r["metrics"], r["config"], r["evalb"]
        d = c["decode"]
        out.append(
            f"| {r['run_id']} | {_settings(r)} | {m['dev_precision']:.2f} | {m['dev_recall']:.2f} | "
            f"{m['dev_f1']:.2f} | {m['test_precision']:.2f} | {m['test_recall']:.2f} | "
            f"{m['test_f1']:.2f}" + (f" (free: {m['test_f1_free']:.2f})" if "test_f1_free" in m else "")
            + f" | {ev['dev']['sentences']}, {ev['test']['sentences']} | "
            f"{ev['test']['well_formed']} of {ev['test']['sentences']}"
            + (f" (free: {ev['test']['free']['well_formed']})" if "free" in ev["test"] else "")
            + f" | {m['dev_ppl']:.2f} | "
            f"{r['data']['vocab_size']} | {m['params'] / 1e6:.2f} | {m['train_steps']} | "
            f"{m['train_seconds'] / 60:.1f} min | {d['beam']}, {d['alpha']}, input + "
            f"{d['max_len_offset']}{', constrained' if d.get('constrained') else ''} |")
    for r in records:
        t = r.get("tuning")
        if t:
            out.append(f"- {r['run_id']}: settings {t['best_params']} from trial {t['best_trial']} "
                       f"of optuna study `{t['study']}` ({t['n_trials']} trials: {t['complete']} "
                       f"finished, {t['pruned']} pruned; {t['metric']} {t['best_value']:.2f} on "
                       f"{t['split']}).")
    out += ["", "*untuned*: the settings of `sweeps/table4.yaml` at this scale; *tuned*: the best "
            "trial of `--tune` (dropout, learning rate and beam size chosen on the dev split, as "
            "the paper). Each record holds its full config. *Targets*: what the model writes for "
            "each word: its POS tag (as the paper's tensor2tensor data), XX (Vinyals & Kaiser et "
            "al.) or the word itself, as its source pieces (`data.linearization`, "
            "reproduce/parsing.py)."]
    if any(r["config"]["decode"].get("constrained") for r in records):
        out.append("*constrained*: beam search could only write well-formed trees with one word "
                   "slot per input word (`decode.constrained`, `decoding.TreeConstraint`); the "
                   "paper decodes freely and its outputs may need the repair ours never do. "
                   "*free*: the same model decoded as the paper does (unconstrained, repaired).")
    out.append("")
    return out


RENDERERS = {"table2": render_table2, "table3": render_table3, "table4": render_table4}
