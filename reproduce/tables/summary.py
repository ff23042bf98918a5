"""The front page's results: a compact Table 3 (each variant's change from base, the paper's
beside ours, and the verdict), Table 2's BLEU and Table 4's F1, rendered from the records at the `cpu` scale
into README.md between two markers, so the page never quotes a number no record holds."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path

from reproduce.records.metrics import COMPARED
from reproduce.records.store import load_records
from reproduce.records.sweep import load_spec
from reproduce.tables.agreement import counts, row_agreement
from reproduce.tables.marks import verdict_cell
from reproduce.tables.table3 import compare_to_base, configuration

START, END = "<!-- results: start -->", "<!-- results: end -->"
SCALE = "cpu"


def summary(results: Path) -> str:
    """The block: Table 3's changes, then Table 2's BLEU, at ``SCALE``, from ``results``."""
    spec = load_spec("table3")
    by_scale: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in load_records("table3", results, move=False):
        by_scale[r["scale"]][r["variant"]].append(r)
    runs = by_scale[SCALE]
    ppl_metric, bleu_metric = COMPARED
    lines = [f"Table 3 at `{SCALE}` (rendered from `results/table3/` by `python -m reproduce "
             "table3 --render`; dev set, change from base, ours with the 95% interval of the "
             "difference):", "",
             "| row | variant (paper's sizes) | ΔPPL paper | ΔPPL ours | ΔBLEU paper | "
             "ΔBLEU ours | verdict PPL; BLEU | seeds |",
             "|---|---|---|---|---|---|---|---|"]
    called: dict[str, dict[str, list[str]]] = {m.short: defaultdict(list) for m in COMPARED}
    for row, names in spec.rows_at(SCALE).items():
        for name in (n for n in names if runs.get(n)):
            ppl, bleu = (compare_to_base(spec, runs, name, metric) for metric in COMPARED)
            cell = verdict_cell(spec, by_scale, SCALE, name,
                                [(ppl_metric, ppl.verdict), (bleu_metric, bleu.verdict)], short=True)
            for metric, c in zip(COMPARED, (ppl, bleu), strict=True):
                marks = verdict_cell(spec, by_scale, SCALE, name, [(metric, c.verdict)], short=True)
                called[metric.short][c.verdict].append(name + marks[len(c.verdict):])
            lines.append(f"| {row} | {name}: {configuration(spec, name)} | {ppl.paper_cell or '–'} "
                         f"| {ppl.ours_cell} | {bleu.paper_cell or '–'} | {bleu.ours_cell} | "
                         f"{cell} | {len(runs[name])} |")
    within = row_agreement(spec, runs, SCALE)
    corpora = {r["config"]["data"]["corpus"] for records in runs.values() for r in records}
    lines += ["", "**What agrees:** " + " ".join(_tally(short, by) for short, by in called.items())
              + f" **Their limits:** every verdict is at `{SCALE}` ({spec.scale(SCALE).about}), "
              f"on {', '.join(sorted(corpora))}; † marks one that the run's later dev evaluations or "
              "another scale do not hold to, ‡ a variant whose settings here leave the range the "
              "paper's variants span. What each disagreement means: "
              "[docs/table3.md](docs/table3.md).", "",
              "Within rows, pairs of variants the paper tells apart: "
              + "; ".join(f"{name} {counts(sum(rows.values(), Counter()))}"
                          for name, rows in within.items()) + "."]
    table2 = load_spec("table2")
    test_bleu = {r["variant"]: r["metrics"].get("test_bleu_tokenized")
                 for r in load_records("table2", results, move=False) if r["scale"] == SCALE}
    cells = [f"{name} {table2.variants[name].paper.get('bleu')} / "
             + (f"{score:.2f}" if (score := test_bleu.get(name)) is not None else "not yet")
             for name in table2.variants]
    lines += ["", f"Table 2 at `{SCALE}`, test BLEU paper / ours (the paper's tokenized "
              "convention; `results/table2.md`): " + "; ".join(cells) + "."]
    return "\n".join(lines + _table4(results))


def _table4(results: Path) -> list[str]:
    """Table 4's line: each configuration's test F1 (dev F1) at ``SCALE``, beside the paper's."""
    from reproduce.tables.table4 import TARGETS, VOCABULARIES

    runs = sorted((r for r in load_records("table4", results, move=False) if r["scale"] == SCALE),
                  key=lambda r: -r["metrics"]["test_f1"])
    if not runs:
        return []
    paper = load_spec("table4").variants["wsj_only"].paper["f1"]
    cells = [f"{TARGETS[r['config']['data']['linearization']].split(' (')[0]}, "
             f"{VOCABULARIES[r['config']['data'].get('vocabulary', 'bpe')]} "
             f"{r['metrics']['test_f1']:.1f} ({r['metrics']['dev_f1']:.1f})" for r in runs]
    return ["", f"Table 4 at `{SCALE}`, test F1 (dev) on NLTK's 10% WSJ sample, not comparable "
            f"with the paper's {paper} on section 23 (`results/table4.md`): "
            + "; ".join(cells) + "."]


def _tally(short: str, by_verdict: dict[str, list[str]]) -> str:
    """One metric's verdicts in a sentence: how many go the paper's way, and which do not."""
    n = sum(map(len, by_verdict.values()))
    said = {"no": "against it", "no effect": "inside our noise", "n/a": "without a verdict"}
    rest = [f"{what}: {', '.join(by_verdict[v])}" for v, what in said.items() if by_verdict.get(v)]
    return (f"{short}: {len(by_verdict.get('yes', []))} of {n} go the paper's way beyond our "
            "noise" + (f"; {'; '.join(rest)}" if rest else "") + ".")


def update_readme(readme: Path, results: Path) -> bool:
    """Rewrite the block between the markers of ``readme`` from ``results``; whether it changed."""
    text = readme.read_text()
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), flags=re.S)
    if not pattern.search(text):
        return False
    new = pattern.sub(lambda _: f"{START}\n{summary(results)}\n{END}", text)
    if new != text:
        readme.write_text(new)
    return new != text
