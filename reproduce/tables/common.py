"""What every rendered table says under itself: corpus, hardware, devices, cost, reference points,
and the cell formats (mean ± std over seeds, signed changes)."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from reproduce.paper.sentence_scores import chrf
from reproduce.paths import results_dir
from reproduce.records.metrics import Metric
from reproduce.records.schema import Record, config_of
from reproduce.records.store import read_outputs
from reproduce.train.devices import Layout

CORPUS_NOTES = {
    "bible-en-de": "Bible EN-DE (World English Bible -> Elberfelder 1905, split by whole books; "
                   "dev = Ruth, Esther, Jonah, Philippians, James, 1 Peter; test = Acts, Romans). "
                   "**Not comparable with WMT numbers.**",
    "bible-en-fr": "Bible EN-FR (World English Bible -> Louis Segond 1910, split by whole books). "
                   "**Not comparable with WMT numbers.**",
    "wmt14-en-de": "WMT14 EN-DE (newstest2013 dev, newstest2014 test), as the paper.",
    "wmt14-en-fr": "WMT14 EN-FR (newstest2013 dev, newstest2014 test), as the paper.",
}


def corpus_note(records: list[Record]) -> str:
    """What the runs were trained on: a shipped corpus by its note; local files (``data_dir``)
    as what they are, whatever the spec called them."""
    notes = []
    shipped = [r for r in records if not r["data"].get("files")]
    for corpus in sorted({r["data"]["corpus"] for r in shipped}):
        notes.append(CORPUS_NOTES.get(corpus, corpus)
                     + _train_pairs([r for r in shipped if r["data"]["corpus"] == corpus]))
    local = {(r["data"]["corpus"], r["data"]["data_dir"], json.dumps(r["data"]["files"])): r
             for r in records if r["data"].get("files")}
    for (corpus, where, _), r in sorted(local.items()):
        d = r["data"]
        sizes = ", ".join(f"{split} {pairs} pairs (sha256 {d['files'][split]['sha256'][:12]})"
                          for split, pairs in (("dev", d["dev_pairs"]), ("test", d["test_pairs"])))
        called = ("" if corpus.startswith("local-") else
                  f" The spec calls it `{corpus}`; these files were not checked to be that "
                  "corpus, so the paper's numbers beside them compare with other data.")
        what, train = f"local files in `{where}`", d["files"]["train"]
        if repo := train.get("repo"):  # a download of the Hub's repository (data.hub.Snapshot)
            at = f"@{train['revision'][:12]}" if train.get("revision") else " (revision unknown)"
            called = (f" The spec calls it `{corpus}`; each shard's SHA-256 (its LFS id on the Hub) "
                      "is in the records, not checked against the Hub here.")
            what = f"a download of {repo}{at} in `{where}`"
        notes.append(f"{what} ({corpus.split('-', 1)[-1].upper()}: train "
                     f"{d['train_pairs']} pairs used (sha256 {d['files']['train']['sha256'][:12]}),"
                     f" {sizes}).{called}")
    return " ".join(notes)


def other_data(variant: list[Record], base: list[Record]) -> str | None:
    """Why a variant's change from base is not a verdict: its runs and base's were trained on
    different data (the corpus's fingerprint: its files edited between them, another download).
    None when they share it, or a record predates fingerprints."""
    ours = {r["data"].get("fingerprint") for r in variant}
    theirs = {r["data"].get("fingerprint") for r in base}
    if not ours or not theirs or None in ours | theirs or ours == theirs:
        return None
    return (f"not compared: trained on other data than base (corpus "
            f"{', '.join(sorted(f[:12] for f in ours if f))} vs base's "
            f"{', '.join(sorted(f[:12] for f in theirs if f))})")


def _train_pairs(records: list[Record]) -> str:
    """How many training pairs the runs used, and how they were taken where not all
    (``data.train_every``, ``data.max_train_pairs``)."""
    used = sorted({r["data"]["train_pairs"] for r in records if r["data"].get("train_pairs")})
    if not used:
        return ""
    ways = set()
    for r in records:
        d = config_of(r).data
        if (k := d.train_every) > 1:
            suffix = "th" if k % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
            ways.add(f"every {k}{suffix} pair")
        if d.max_train_pairs:
            ways.add(f"the first {d.max_train_pairs}")
    return (f" Training pairs used: {', '.join(map(str, used))}"
            + (f" ({'; '.join(sorted(ways))} of the training split)" if ways else "") + ".")


def mean_std(values: list[float], digits: int) -> str:
    if not values:
        return ""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return (f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f} "
            f"(n={len(values)})")


def mean_paper_flops(records: list[Record]) -> float | None:
    """The mean training cost of ``records`` by the paper's method; None when there are none, or
    one trained on a device whose peak is unknown (its cost is None)."""
    flops = [f for r in records if (f := r["cost"].get("paper_method_flops")) is not None]
    return statistics.mean(flops) if flops and len(flops) == len(records) else None


def cost_line(records: list[Record]) -> str:
    """What the table's runs took, and where: worker-hours per CPU or GPU kind, with the CPU
    flags that decide its speed (our machines differ)."""
    by_where: dict[str, list[float]] = defaultdict(list)
    reused = [r for r in records if r.get("trained_by")]
    for r in records:
        if r.get("trained_by"):
            continue  # counted with the run that trained it
        h = r["hardware"]
        if h.get("gpus"):
            where = gpus_label(h)
            if (share := r.get("cost", {}).get("gpu_shared_by", 1)) > 1:
                where += f", {share} runs side by side"
        else:
            flags = set(h.get("cpu_flags") or [])
            known = ", ".join(f for f in ("avx2", "avx512f", "avx512_bf16") if f in flags)
            amx = "AMX" if any(f.startswith("amx") for f in flags) else "no AMX"
            where = (f"{h['cpu']} ({known}, {amx}; {h.get('torch_threads', '?')} thread(s))"
                     if flags else f"{h['cpu']} (flags not recorded)")
        by_where[where].append(r["metrics"]["train_seconds"] * r.get("cost", {}).get("devices", 1))
    parts = [f"{sum(v) / 3600:.1f} worker-hours of training for {len(v)} runs on {where}"
             for where, v in sorted(by_where.items())]
    if reused:
        parts.append(f"{len(reused)} run(s) evaluated from another run's training, counted there: "
                     + ", ".join(f"{r['run_id']} ({r['trained_by']['run_id']}'s training)"
                                 for r in reused))
    return "Cost: " + "; ".join(parts) + "."


def reference_line(records: list[Record]) -> list[str]:
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


def score(record: Record, metric: Metric) -> tuple[float | None, bool]:
    """A record's ``metric``, and whether it was rescored here: a chrF a record made before chrF
    was recorded is computed from its kept hypotheses and references (``records.store
    .read_outputs``); (None, False) where neither is there."""
    if metric.key in record["metrics"]:
        return float(record["metrics"][metric.key]), False
    if metric.sentences != "chrf":
        return None, False
    texts = read_outputs(results_dir() / record.get("table", ""), record, metric.split)
    if texts is None:
        return None, False
    return round(chrf(*texts)["score"], 2), True


def signed(value: float | None) -> str:
    return "" if value is None else f"{value:+.2f}"


def fmt(value: Any, digits: int | None = None) -> str:
    """A cell: empty for None; with ``digits``, a number printed as the paper prints it (its
    PPL 5.00, not 5.0)."""
    if value is None:
        return ""
    return str(value) if digits is None else f"{value:.{digits}f}"


def layouts(records: list[Record]) -> str:
    """How the runs were spread over devices: devices x accumulation x micro-batch = tokens/step
    (records made before layouts were recorded trained on one device)."""
    counts: dict[str, int] = defaultdict(int)
    for r in records:
        b = r.get("batch") or {}
        if not {"accumulate", "device_batch_tokens", "effective_tokens_per_step"} <= set(b):
            continue  # a record without its batch layout says nothing here
        n, nodes = b.get("world_size", b.get("devices", 1)), b.get("nodes", 1)
        where = Layout(b.get("accelerator", "cpu"), n // nodes, nodes).describe(backend=False)
        counts[f"{where} x {b['accumulate']} accumulated x "
               f"{b['device_batch_tokens']} tokens = {b['effective_tokens_per_step']} tokens per "
               "step"] += 1
    return "; ".join(f"{k} ({v} run{'s' if v > 1 else ''})" for k, v in sorted(counts.items()))


def devices_line(records: list[Record]) -> list[str]:
    spread = layouts(records)
    return [f"Devices: {spread}."] if spread else []


def hours_note(record: Record) -> str:
    """What to say after a run's training hours: " (H200)" for a GPU's (not a CPU run's hours),
    " (table2's training)" for a run evaluated from another run's training (``sharing``)."""
    gpus = record["hardware"].get("gpus") or []
    notes = [gpus[0].removeprefix("NVIDIA ")] if gpus else []
    if trained := record.get("trained_by"):
        notes.append(f"{trained['table']}'s training")
    return f" ({', '.join(notes)})" if notes else ""


def gpus_label(h: Mapping[str, Any]) -> str:
    """A record's GPUs as "<count>x <name>" (``h``: its ``hardware``)."""
    return f"{len(h['gpus'])}x {h['gpus'][0]}"


def hardware_line(records: list[Record]) -> str:
    return "; ".join(sorted({r["hardware"]["cpu"] if not r["hardware"]["gpus"]
                             else gpus_label(r["hardware"]) for r in records}))


def scale_note(sc, what: str) -> str:
    if sc is None:
        return ""
    rows = (f" This scale runs row{'s' if len(sc.rows) > 1 else ''} {', '.join(sc.rows)} only"
            + (f", and of its variants {', '.join(sc.variants)} beside base" if sc.variants
               else "") + "." if sc.rows else "")
    return (f"{sc.about}. Widths x{sc.width:g} and steps x{sc.steps:g} of the paper's ({what}; "
            f"every variant is resized by the same factors).{rows}")


def sci(value: float | None) -> str:
    return "" if value is None else f"{value:.1e}"
