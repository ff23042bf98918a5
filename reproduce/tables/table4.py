"""Table 4: English constituency parsing, F1 on WSJ section 23 (or the NLTK sample), beside the
paper's rows."""

from __future__ import annotations

from collections import defaultdict

from reproduce.data import missing_input
from reproduce.records.metrics import TEST_F1
from reproduce.records.schema import Record, config_of
from reproduce.records.sweep import Spec
from reproduce.tables.common import cost_line, fmt, hardware_line, mean_std, scale_note

TREEBANKS = {"nltk-sample": "NLTK WSJ sample", "wsj": "WSJ"}


# Table 4's target formats (data.linearization; records from before the field used XX).
TARGETS = {"tags": "POS-tag targets", "xx": "XX targets", "words": "word targets (not the paper's)"}


# data.vocabulary (records from before the field used BPE pieces)
VOCABULARIES = {"bpe": "BPE pieces", "words": "one token a word"}


def _settings(record: Record) -> str:
    tuning = record.get("tuning")
    c = config_of(record)
    return ((f"tuned on dev ({tuning['n_trials']} trials)" if tuning else "untuned")
            + f", {TARGETS[c.data.linearization]}, {VOCABULARIES[c.data.vocabulary]}"
            + (", weights chosen on dev" if record.get("pick") else ""))


def _metric(name: str) -> str:
    """``dev_f1`` as a reader writes it: dev F1."""
    return name.replace("_", " ").replace("f1", "F1").replace("bleu", "BLEU")


def _weights(record: Record) -> str:
    """Which weights were scored: the one chosen on dev (``train.pick``), or the final ones."""
    pick = record.get("pick")
    if pick:
        return f"{pick['chosen']} (best {_metric(pick['metric'])} of {len(pick['candidates'])})"
    averaged = record.get("averaged_checkpoints") or []
    return f"average of the last {len(averaged)}" if len(averaged) > 1 else "final"


def _vocabulary(record: Record) -> str:
    v = record["data"].get("vocabulary")
    size = record["data"]["vocab_size"]
    if not v:
        return str(size)
    return (f"{size}, {VOCABULARIES[v['kind']]}: {v['one_token']:.1f}% of dev words one token, "
            f"{v['own_token']:.1f}% their own")


def render_table4(spec: Spec, records: list[Record]) -> str:
    """The paper's Table 4 (every cited parser, its training data and F1) with our rows under the
    paper's Transformer rows, then the details of our runs, by scale and treebank."""
    lines = [f"# Table 4: {spec.caption}", "",
             f"Rendered by `python -m reproduce table4` from the run records in `results/{spec.table}/`; "
             "never edited by hand. Rows without *ours* are the published figures as the paper "
             "cites them (WSJ section 23).", "",
             "| Parser | Training | WSJ 23 F1 |", "|---|---|---|"]
    ours: dict[str, dict[tuple[str, str, str], list[Record]]] = defaultdict(dict)
    for r in records:
        key = (r["scale"], r["treebank"]["kind"], _settings(r))
        ours[r["variant"]].setdefault(key, []).append(r)
    for row in spec.cited:
        lines.append(f"| {row['parser']} | {row['training']} | {fmt(row.get('f1'))} |")
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
                f1 = mean_std([r["metrics"][TEST_F1.key] for r in recs], TEST_F1.digits)
                dev = mean_std([r["metrics"]["dev_f1"] for r in recs], TEST_F1.digits)
                where = "the sample's test files" if kind == "nltk-sample" else "section 23"
                lines.append(f"| {row['parser']}, ours, scale `{scale}`, "
                             f"{TREEBANKS.get(kind, kind)}, {settings} | {row['training']} | "
                             f"{f1} ({where}; dev {dev}) |")
    lines += ["", "Our F1: labelled bracketing F1 on the test split, EVALB COLLINS.prm conventions "
              "(function tags stripped, PRT = ADVP, punctuation and the root not counted), model "
              "output repaired into a tree over the input words and given the gold POS tags. On "
              "NLTK's 10% WSJ sample (3,914 sentences, split by file) the training set is ~13x "
              "smaller than sections 02-21 and the test files are not section 23: **those F1 are "
              "not comparable with the paper's**.", ""]
    if not records:
        lines.append("No runs recorded yet.")
    by_data: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for r in records:
        by_data[(r["scale"], r["treebank"]["kind"])].append(r)
    for (scale, kind), recs in by_data.items():
        lines += _table4_details(spec, scale, kind, recs)
    return "\n".join(lines) + "\n"


def _table4_details(spec: Spec, scale: str, kind: str, records: list[Record]) -> list[str]:
    first = records[0]
    out = [f"## Our runs at scale `{scale}` on the {TREEBANKS.get(kind, kind)}", "",
           scale_note(spec.scales.get(scale), "model sizes as named"), "",
           f"Data: {first['treebank']['about']}"
           + (f" ({first['treebank']['path']})" if first["treebank"].get("path") else "") + ". "
           f"Hardware: {hardware_line(records)}.", cost_line(records), "",
           "| run | settings | dev P | dev R | dev F1 | test P | test R | test F1 | sentences "
           "(dev, test) | well-formed outputs (test) | weights scored | dev PPL | vocabulary | "
           "params ×10⁶ | steps | training time | beam, alpha, max length |", "|" + "---|" * 17]
    for r in sorted(records, key=lambda r: r["run_id"]):
        m, d, ev = r["metrics"], config_of(r).decode, r["evalb"]
        out.append(
            f"| {r['run_id']} | {_settings(r)} | {m['dev_precision']:.2f} | {m['dev_recall']:.2f} | "
            f"{m['dev_f1']:.2f} | {m['test_precision']:.2f} | {m['test_recall']:.2f} | "
            f"{m['test_f1']:.2f}" + (f" (free: {m['test_f1_free']:.2f})" if "test_f1_free" in m else "")
            + f" | {ev['dev']['sentences']}, {ev['test']['sentences']} | "
            f"{ev['test']['well_formed']} of {ev['test']['sentences']}"
            + (f" (free: {ev['test']['free']['well_formed']})" if "free" in ev["test"] else "")
            + f" | {_weights(r)} | {m['dev_ppl']:.2f} | "
            f"{_vocabulary(r)} | {m['params'] / 1e6:.2f} | {m['train_steps']} | "
            f"{m['train_seconds'] / 60:.1f} min | {d.beam}, {d.alpha}, input + "
            f"{d.max_len_offset}{', constrained' if d.constrained else ''} |")
    out += _place(records) + _picks(records)
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
            "reproduce/paper/parsing.py)."]
    if any(config_of(r).decode.constrained for r in records):
        out.append("*constrained*: beam search could only write well-formed trees with one word "
                   "slot per input word (`decode.constrained`, `decoding.TreeConstraint`); the "
                   "paper decodes freely and its outputs may need the repair ours never do. "
                   "*free*: the same model decoded as the paper does (unconstrained, repaired).")
    out.append("")
    return out


def _place(records: list[Record]) -> list[str]:
    """Where each run's parser lost its place on dev (``paper.place``), where its record says."""
    rows = []
    for r in sorted(records, key=lambda r: r["run_id"]):
        for how, entry in (("", r["evalb"]["dev"]), ("free", r["evalb"]["dev"].get("free") or {})):
            p = entry.get("place")
            if p:
                rows.append(
                    f"| {r['run_id']}{' (free)' if how else ''} | {p['words']} | {p['slots']} | "
                    f"{p['in_place'] / p['words'] * 100:.1f}% | {p['substituted']} | "
                    f"{p['inserted']} | {p['deleted']} | {p['shifted_sentences']} of "
                    f"{entry['sentences']} | {entry['f1']:.2f} | {p['oracle_f1']:.2f} | "
                    f"{p['oracle_f1'] - entry['f1']:+.2f} |")
    if not rows:
        return []
    return ["", "Where the parser loses its place (dev): each output's word slots aligned with "
            "the sentence's (`paper.place`: tags with tag targets; an insertion and a deletion "
            "is a shift). *In place*: slots equal to the gold at the same position; *oracle F1*: "
            "with every slot given the word it is aligned to, what keeping its place costs.", "",
            "| run | words | slots | in place | substituted | inserted | deleted | sentences "
            "shifted | F1 | oracle F1 | F1 lost to place |", "|" + "---|" * 11, *rows]


def _picks(records: list[Record]) -> list[str]:
    """Each candidate's dev score, where the weights were chosen on dev (``train.pick``)."""
    lines = []
    for r in sorted(records, key=lambda r: r["run_id"]):
        pick = r.get("pick")
        if pick:
            tried = "; ".join(f"{c['weights']} {c[pick['metric']]:.2f}" for c in pick["candidates"])
            lines.append(f"- {r['run_id']}: {pick['how']}, {_metric(pick['metric'])}: "
                         f"{tried}; chosen: **{pick['chosen']}**, the test split scored once.")
    return ["", "Weights chosen on dev:", "", *lines] if lines else []
