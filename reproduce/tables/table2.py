"""Table 2: BLEU and training cost (the paper's method and counted FLOPs) for base and big, EN-DE
and EN-FR, beside the paper's and the systems it cites."""

from __future__ import annotations

from collections import defaultdict

from reproduce.records.checkpoints import STEP_NAME
from reproduce.records.metrics import TEST_BLEU_TOKENIZED, TEST_CHRF
from reproduce.records.schema import Record
from reproduce.records.sweep import Spec
from reproduce.tables.common import (
    corpus_note,
    cost_line,
    devices_line,
    fmt,
    hardware_line,
    hours_note,
    mean_paper_flops,
    mean_std,
    scale_note,
    sci,
    score,
)

LANGS = ("en_de", "en_fr")


def render_table2(spec: Spec, records: list[Record]) -> str:
    """The paper's Table 2 with our Transformer rows added, then the details of our runs.

    In the main table our BLEU is the paper's convention (tokenized, compound-split) and our cost
    the paper's method; sacreBLEU and the counted FLOPs sit in the details table, labelled."""
    lines = [f"# Table 2: {spec.caption}", "",
             f"Rendered by `python -m reproduce table2` from the run records in `results/{spec.table}/`; "
             "never edited by hand. Rows without *ours* are the paper's published figures as "
             "it cites them.", "",
             "| Model | BLEU EN-DE | BLEU EN-FR | Training cost EN-DE (FLOPs) | "
             "Training cost EN-FR (FLOPs) |", "|---|---|---|---|---|"]
    for row in spec.cited:
        lines.append(f"| {row['model']} | {fmt(row.get('bleu_en_de'))} | "
                     f"{fmt(row.get('bleu_en_fr'))} | {sci(row.get('flops_en_de'))} | "
                     f"{sci(row.get('flops_en_fr'))} |")
    by_scale: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_scale[r["scale"]].append(r)
    details = []
    for scale, recs in by_scale.items():
        for size in ("base", "big"):
            cells: dict[str, list[Record]] = defaultdict(list)
            for r in recs:
                if r["variant"].startswith(size + "-"):
                    cells[r["variant"].split("-", 1)[1].replace("-", "_")].append(r)
            if not cells:
                continue
            bleu = [mean_std([c["metrics"][TEST_BLEU_TOKENIZED.key] for c in cells[lang]],
                             TEST_BLEU_TOKENIZED.digits)
                    for lang in LANGS]
            cost = [sci(f) if (f := mean_paper_flops(cells[lang])) is not None else ""
                    for lang in LANGS]
            corpora = {c["data"]["corpus"].split("-")[0] for rs in cells.values() for c in rs}
            where = "" if corpora == {"wmt14"} else f" on {'/'.join(sorted(corpora))}, not WMT"
            lines.append(f"| Transformer ({size}), ours, scale `{scale}`{where} | {bleu[0]} | {bleu[1]} | "
                         f"{cost[0]} | {cost[1]} |")
        details += _table2_details(spec, scale, recs)
    lines += ["", "Our BLEU above is the paper's convention: Moses-tokenized, compound-split "
              "(`##AT##-##AT##`), 4-gram corpus BLEU as multi-bleu computes it, on the test split "
              "after checkpoint averaging. Our cost above is the paper's method: training time x "
              "devices x sustained TFLOPS per device.", ""]
    if not records:
        lines.append("No runs recorded yet.")
    return "\n".join(lines + details) + "\n"


def _table2_details(spec: Spec, scale: str, records: list[Record]) -> list[str]:
    ran = {r["variant"] for r in records}
    missing = [v for v in spec.variants if v not in ran]
    out = [f"## Our runs at scale `{scale}`", "", scale_note(spec.scales.get(scale), "model "
           "sizes as named"), "", "Corpus: " + corpus_note(records),
           f"Hardware: {hardware_line(records)}.", *devices_line(records), cost_line(records),
           *([f"Not run at this scale yet: {', '.join(missing)} (`python -m reproduce status` "
              "says what they would take here)."] if missing else []), "",
           "| variant | tokenized BLEU (paper's convention) | sacreBLEU | chrF | cost, paper's method "
           "(FLOPs) | cost, counted (FLOPs) | training time | devices x TFLOPS | tokens/step "
           "(effective) | checkpoints averaged | dev PPL, final weights -> averaged |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(records, key=lambda r: list(spec.variants).index(r["variant"])
                    if r["variant"] in spec.variants else 99):
        cost, m, batch = r["cost"], r["metrics"], r["batch"]
        chrf, rescored = score(r, TEST_CHRF)
        out.append(
            f"| {r['variant']} (seed {r['seed']}) | {m['test_bleu_tokenized']:.2f} | "
            f"{m['test_bleu']:.2f} | {fmt(chrf, TEST_CHRF.digits + 1)}{'*' if rescored else ''} | "
            f"{sci(cost['paper_method_flops'])} | "
            f"{sci(cost['analytic_flops'])} | {m['train_seconds'] / 3600:.2f} h{hours_note(r)} | "
            f"{cost['devices']} x {cost['tflops_per_device']} ({cost['tflops_source']}) | "
            f"{batch['effective_tokens_per_step']} ({batch['accumulate']} accumulated) | "
            f"{_averaged(r['averaged_checkpoints'])} | {_averaging_gain(r)} |")
    signatures = sorted({r["bleu"]["test"]["sacrebleu"]["signature"] for r in records}
                        | {r["bleu"]["test"]["tokenized"]["signature"] for r in records})
    out += ["", "chrF: sacreBLEU's (character 6-grams, beta 2) on the detokenized test split; "
            "* rescored here from the record's kept hypotheses (recorded by runs since "
            "chrF was added).", "",
            "Signatures: " + "; ".join(f"`{s}`" for s in signatures), ""]
    return out


def _averaged(names: list[str]) -> str:
    """How many checkpoints were averaged and, from their names (``step{N}.ckpt``), the steps
    they span: what share of the training the average covers."""
    if not names:
        return "none"
    steps = sorted(int(m[1]) for n in names if (m := STEP_NAME.fullmatch(n)))  # step9-v1.ckpt too
    return f"{len(names)}" + (f" (steps {steps[0]}-{steps[-1]})" if len(steps) == len(names) else "")


def _averaging_gain(record: Record) -> str:
    """Dev PPL of the final weights (the learning curve's point at the last step, before
    averaging) beside the record's, measured on the averaged weights: what averaging bought."""
    curve = record.get("curve", {}).get("dev_ppl") or []
    last = record["metrics"].get("train_steps")
    final = next((ppl for step, _, ppl in reversed(curve) if step == last), None)
    averaged = record["metrics"].get("dev_ppl")
    if final is None or averaged is None or not record["averaged_checkpoints"]:
        return "–"
    return f"{final:.2f} -> {averaged:.2f}"
