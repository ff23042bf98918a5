"""``python -m reproduce verify RECORD [--steps N]``: re-run a record's run from nothing and compare.

The run is trained again in a scratch folder (its own results, runs and tokenizer cache; the
project's ``results/``, ``runs/`` and ``cache/`` are never touched) with the record's config,
precision and thread count. Then every metric is compared with the record, and so are the hashes
of its config (against what the spec resolves to today), data and vocabulary. ``--steps N`` trains
the first N steps only and compares the learning curve there (the schedule does not depend on the
step count, so the first N steps of a longer run are these N steps). Where the numbers differ,
it lists what differs between the machine and code that made the record and this one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import pytorch_lightning as pl
import torch

from reproduce import paths
from reproduce.config import Config
from reproduce.data.hub import file_sha256
from reproduce.errors import ConfigError, SpecError
from reproduce.records import store as records
from reproduce.records.schema import Record
from reproduce.records.sweep import PlannedRun, load_spec
from reproduce.train import fit as training
from reproduce.train import parses, runner
from reproduce.util import machine

# Metrics that measure the machine, not the model: never compared.
TIMING = ("train_seconds", "train_cpu_seconds")


@contextmanager
def _scratch(folder: Path):
    """Results, runs and caches under ``folder`` while the block runs."""
    keys = {"REPRODUCE_RESULTS": folder / "results", "REPRODUCE_RUNS": folder / "runs",
            "REPRODUCE_CACHE": folder / "cache"}
    before = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: str(v) for k, v in keys.items()})
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _run_of(record: Record, config: Config) -> PlannedRun:
    prefix = f"{record['table']}-{record['variant']}-{record['scale']}-seed{record['seed']}"
    tag = record["run_id"][len(prefix) + 1:] if record["run_id"] != prefix else ""
    return PlannedRun(record["table"], record["row"], record["variant"], record["scale"],
                      record["seed"], config, record.get("paper", {}), tag=tag,
                      overridden=record.get("scale_overrode", {}), sets=record.get("set", {}))


def _spec_line(record: Record, spec_path: str | None = None) -> str:
    """Whether the spec (``--spec``, else the shipped one) still resolves this run to the recorded
    config."""
    try:
        spec = load_spec(spec_path or record["table"])
        [run] = spec.plan([record["variant"]], record["scale"], [record["seed"]])
    except (SpecError, ConfigError, ValueError, KeyError):
        return (f"config: {'no shipped spec' if spec_path is None else spec_path + ' does not'} "
                "plan this run; the record's own config is used")
    where = spec_path or "sweeps/"
    if records.same_config(record["config"], run.config):
        return f"config: the same as {where} resolves it today"
    return (f"config: DIFFERENT from what {where} resolves today (the sweep command would redo "
            "this run); the record's own config is used")


def _environment_differences(record: Record) -> list[str]:
    """What differs between where the record was made and here (reasons numbers may differ)."""
    now = {"commit": machine.commit(), "hardware": machine.hardware()}
    out = []
    was, is_ = record.get("commit", {}), now["commit"]
    if was.get("sha") != is_["sha"]:
        out.append(f"code: recorded at commit {str(was.get('sha'))[:10]}, now {str(is_['sha'])[:10]}")
    if was.get("dirty") or is_["dirty"]:
        out.append("code: uncommitted changes " + ("then" if was.get("dirty") else "now"))
    h, n = record.get("hardware", {}), now["hardware"]
    for key, what in (("cpu", "CPU"), ("torch", "torch"), ("gpus", "GPUs")):
        if h.get(key) != n.get(key):
            out.append(f"{what}: {h.get(key)} then, {n.get(key)} now")
    if set(h.get("cpu_flags", [])) != set(n.get("cpu_flags", [])) and "cpu_flags" in h:
        out.append(f"CPU flags: {sorted(h['cpu_flags'])} then, {sorted(n['cpu_flags'])} now")
    if "sha256" not in record.get("data", {}):
        out.append("the record predates dropout seeded per step (commit b90a035): its masks came "
                   "from one stream seeded at the start, which this code no longer draws")
        if record.get("resumed"):
            out.append(f"the recorded run was resumed (from {record.get('resumed_from')}) before "
                       "resuming was exact")
    if record.get("batch", {}).get("world_size", 1) > 1:
        out.append(f"the recorded run trained on {record['batch']['world_size']} devices")
    return out


def _hash_lines(record: Record, fresh: Record) -> list[str]:
    lines = []
    for name, old, new in (("data", record["data"].get("sha256"), fresh["data"].get("sha256")),
                           ("vocabulary", record["data"].get("vocab_sha256"),
                            fresh["data"].get("vocab_sha256"))):
        if old is None:
            lines.append(f"{name}: the record keeps no hash (made before hashes were kept)")
        else:
            lines.append(f"{name}: {'the same' if old == new else 'DIFFERENT'} (sha256 "
                         f"{json.dumps(old)[:40]}...)")
    return lines


def _close(old: float, new: float, tolerance: float) -> bool:
    """Whether ``new`` is ``old`` within ``tolerance`` of it (relative; 0: equal)."""
    return new == old or abs(new - old) <= tolerance * abs(old)


def _relative(old: float, new: float) -> float:
    return abs(new - old) / abs(old) if old else (0.0 if new == old else float("inf"))


def _compare(old: Mapping[str, Any], new: Mapping[str, Any], tolerance: float = 0.0
             ) -> tuple[list[str], bool]:
    """A line per number (recorded, re-run, difference); whether all are equal (within
    ``tolerance``, relative)."""
    lines, same = [f"  {'metric':24} {'recorded':>12} {'re-run':>12} {'difference':>12}"], True
    for key, value in old.items():
        if key in TIMING or not isinstance(value, (int, float)) or key not in new:
            continue
        diff = new[key] - value
        same &= _close(value, new[key], tolerance)
        lines.append(f"  {key:24} {value:>12} {new[key]:>12} {diff:>+12.4g}")
    return lines, same


def _curve_points(curve: Mapping[str, Any]) -> dict[tuple[str, int], float]:
    """{(train_loss or dev_ppl, step): value} of a recorded learning curve."""
    return {(kind, int(p[0])): p[2] for kind, points in curve.items() for p in points}


def verify(path: Path, steps: int | None = None, scratch: Path | None = None,
           tolerance: float = 0.0, precision: str | None = None, spec: str | None = None) -> int:
    """Print the comparison; 0 if every compared number is equal (within ``tolerance``,
    relative, where one is given), else 1. ``precision``: re-run in this precision instead of
    the record's (to see what another precision changes, as a replay on other hardware does)."""
    if tolerance < 0:
        raise ConfigError(f"--tolerance {tolerance}: must be >= 0 (relative, e.g. 0.01 for 1 %)")
    try:
        record = records.read_record(path)
    except records.DamagedRecord as e:
        raise ConfigError(str(e)) from None
    if record is None:
        raise ConfigError(f"{path}: no such record")
    config = Config.from_dict(record["config"]).overrides(precision=precision
                                                          or record["precision"])
    if steps is not None:
        if not 0 < steps <= record["metrics"]["train_steps"]:
            raise ConfigError(f"--steps {steps}: must be between 1 and the run's "
                              f"{record['metrics']['train_steps']} steps")
        config = config.overrides(train_steps=steps)
    run = _run_of(record, config)
    folder = scratch or Path(tempfile.mkdtemp(prefix="reproduce-verify-"))
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, min(record.get("hardware", {}).get("torch_threads") or threads,
                                     machine.cores())))
    print(f"verify {path}: {record['run_id']} again in {folder}, "
          f"{f'the first {steps} steps' if steps else 'all of it'}, precision "
          f"{config.train.precision}"
          + (f" (the record's: {record['precision']})" if precision else "")
          + f", {torch.get_num_threads()} thread(s)"
          + (f", equal within {tolerance:g} (relative)" if tolerance else ""))
    print(_spec_line(record, spec))
    evidence, consistent = _evidence_lines(record, path.parent)
    print("\n".join(([kept] if (kept := _without_outputs(record)) else []) + evidence))
    if carried := _record_tokenizer(record, folder / "cache" / "spm"):
        print(f"tokenizer: the record's, from {carried}")
    try:
        with _scratch(folder):
            if steps is None:
                outcome = runner.execute(run, record["split"], f"verify {path}")
                if (fresh := outcome.record) is None:  # a scratch folder holds no other worker
                    raise RuntimeError(f"{run.run_id}: {outcome.why}")
                lines, same = _compare(record["metrics"], fresh["metrics"], tolerance)
                lines += _hash_lines(record, fresh)
                old_curve: Mapping[str, Any] = record.get("curve", {})
                new_curve: Mapping[str, Any] = fresh["curve"]
            else:
                old_curve = record.get("curve", {})
                new_curve, vocab = _train_only(run, _cadence(old_curve.get("train_loss", [])))
                lines, same = _vocabulary_line(record, vocab)
            a, b = _curve_points(old_curve), _curve_points(new_curve)
            common = sorted(k for k in a.keys() & b.keys() if steps is None or k[1] <= steps)
            differ = [k for k in common if not _close(a[k], b[k], tolerance)]
            same &= not differ and bool(common or steps is None)
            within = f" within {tolerance:g}" if tolerance else ""
            lines.append(f"learning curve: {len(common)} common point(s), "
                         + (f"{len(differ)} differ{within} (first: {differ[0][0]} at step "
                            f"{differ[0][1]}: {a[differ[0]]} recorded, {b[differ[0]]} now)"
                            if differ else f"all equal{within}"))
            if common and any(a[k] != b[k] for k in common):
                worst = max(common, key=lambda k: _relative(a[k], b[k]))
                lines.append(f"largest relative difference: {_relative(a[worst], b[worst]):.2g}"
                             f" ({worst[0]} at step {worst[1]})")
    finally:
        torch.set_num_threads(threads)
    print("\n".join(lines))
    same &= consistent
    if same:
        within = f" within {tolerance:g}" if tolerance else ""
        print(f"verified: the re-run gives the recorded numbers{within}" if steps is None else
              f"verified: the first {steps} steps give the recorded learning curve{within}")
        return 0
    reasons = _environment_differences(record)
    print("NOT the recorded numbers. " + ("What differs from where the record was made: "
                                          + "; ".join(reasons) if reasons else
                                          "Nothing recorded about code or machine differs."))
    return 1


def _without_outputs(record: Record) -> str:
    """The line for a translation record made before every hypothesis was kept beside records:
    its BLEU cannot be recomputed from files, and this re-run writes them."""
    bleu = record.get("bleu") or {}
    if not bleu or all(split.get("outputs") for split in bleu.values()):
        return ""
    return ("this record keeps no hypotheses (made before outputs were kept beside records): "
            "its BLEU cannot be recomputed from files; a full re-run writes them in the scratch "
            "folder's results/")


def _evidence_lines(record: Record, folder: Path) -> tuple[list[str], bool]:
    """Whether a record's per-sentence evidence is its scores' (``records.store.write_evidence``;
    a parsing record's kept parses: ``parses.kept_lines``):
    per split, the statistics recomputed from the kept hypotheses and references are the kept
    ones, their corpus scores are the recorded BLEU, tokenized BLEU and chrF, and on dev the NLL
    and tokens give the recorded dev PPL (within 1e-3, relative: validation sums them in another
    order). A line per split, and False where any differs."""
    from reproduce.paper.sentence_scores import corpus_score, perplexity, sentence_stats

    lines, ok = [], True
    for split, bleu in (record.get("bleu") or {}).items():
        try:
            kept = records.read_evidence(folder, record, split)
            texts = records.read_outputs(folder, record, split)
        except (records.DamagedRecord, OSError) as e:
            lines.append(f"evidence of {split}: UNREADABLE ({e})")
            ok = False
            continue
        if kept is None or texts is None:
            lines.append(f"evidence of {split}: none kept (made before per-sentence evidence "
                         "was kept beside records)")
            continue
        lang = record["config"]["data"]["corpus"].rsplit("-", 1)[-1]
        wrong = [kind for kind, stats in kept["stats"].items()
                 if stats != sentence_stats(kind, *texts, lang)
                 or abs(corpus_score(kind, stats) - cast(dict, bleu)[kind]["score"]) > 0.005]
        if split == "dev" and "dev_ppl" in record["metrics"]:
            ppl = perplexity(kept["nll"], kept["tokens"])
            if abs(ppl - record["metrics"]["dev_ppl"]) > 1e-3 * record["metrics"]["dev_ppl"]:
                wrong.append(f"NLL (PPL {ppl:.3f} from the sentences)")
        ok &= not wrong
        lines.append(f"evidence of {split}: {kept['sentences']} sentences, "
                     + (f"DIFFERENT from the record: {', '.join(wrong)}" if wrong else
                        "statistics of the kept outputs and the recorded scores"
                        + (" and dev PPL" if split == "dev" else "")))
    parsed, same = parses.kept_lines(folder, cast(dict, record))  # Table 4: the kept parses
    return lines + parsed, ok and same


def _cadence(points: list[list[float]]) -> int | None:
    """Every how many steps a recorded curve has a point (so a shorter re-run keeps the same)."""
    return int(points[1][0] - points[0][0]) if len(points) > 1 else None


def _train_only(run: PlannedRun, curve_every: int | None) -> tuple[dict[str, list], str]:
    """The learning curve of ``run``'s steps, trained without evaluation or record, and the
    sha256 of the vocabulary it trained with."""
    c = run.config
    pl.seed_everything(c.train.seed, workers=True, verbose=False)
    tokenizer, data = training.build_data(c)
    work = paths.runs_dir() / run.table / run.run_id
    clock = training.fit(run, work, data, False, c.train.precision, curve_every=curve_every)[2]
    return clock.curve, tokenizer.sha256


def _record_tokenizer(record: Record, spm: Path) -> Path | None:
    """Copy the record's own BPE model (the file in the project's ``cache/spm/`` whose sha256 is
    the record's ``vocab_sha256``) into the scratch cache ``spm``, where the replay finds it
    instead of training one: sentencepiece's training depends on its threads, so a BPE trained
    here can differ from the one a 16-core machine trained on the same text. The file copied;
    None where the cache holds none."""
    want = record.get("data", {}).get("vocab_sha256")
    for model in sorted((paths.cache_dir() / "spm").glob("*.model")) if want else []:
        if file_sha256(str(model), (st := model.stat()).st_size, st.st_mtime_ns) == want:
            spm.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(model, spm / model.name)
            return model
    return None


def _vocabulary_line(record: Record, sha256: str) -> tuple[list[str], bool]:
    """Whether the replay trained with the record's vocabulary: a line, and False when not."""
    want = record.get("data", {}).get("vocab_sha256")
    if want is None or want == sha256:
        return [f"vocabulary: {'the same' if want else 'the record keeps no hash'}"], True
    return [f"vocabulary: DIFFERENT (sha256 {sha256[:12]}... here, {want[:12]}... recorded): "
            "not the recorded run; put the record's BPE model in the cache's spm/ folder "
            f"({paths.cache_dir() / 'spm'}) and verify again"], False
