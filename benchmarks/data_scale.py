"""The data path at WMT's size: a WMT-sized corpus made offline, its cache built once, then what a
later run pays before its first step, its memory, and the batches per second its loader delivers.

    python benchmarks/data_scale.py [--pairs 1000000 4500000 9000000] [--ranks 1 2]
        [--work /tmp/data-scale] [--out results/data-scale.md]

The corpus (WMT14 EN-DE has 4.5M training pairs): each training pair is 1 or 2 consecutive Bible
training verses joined, drawn with a fixed seed (~1.7 GB of ``train.jsonl`` at 4.5M pairs); dev and
test are 3000 and 3003 pairs of the dev and test books, in the local-files layout a user's WMT
files would have. Vocabulary 37000 and batches of 25,000 tokens, as the paper's.

For each size: the **first run** (an empty cache and an empty ``datasets`` cache, in a process of
its own) reads the files, trains the BPE model and encodes the corpus into the cache, each stage
timed, with the process's peak RSS and CPU seconds; Table 2's EN-FR is extrapolated from the
largest size by a rule the report states. Then a **later run** with 1 rank and with 2
(each rank a process, as ``--devices 2`` starts them): from the process's start to its first
training batch (imports, the files' fingerprint, the tokenizer, mapping the cache, the epoch's
batch plan); each process's anonymous (private) memory and the cache files' Pss and Rss at the
first batch and after one full pass over its share of an epoch's batches; and the batches per
second its loader delivers over that pass (collated in this process, no model). Writes a Markdown
report naming the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 37_000
BATCH_TOKENS = 25_000


def generate(folder: Path, pairs: int, seed: int = 0) -> Path:
    """A WMT-sized corpus in the local-files layout (skipped when already there)."""
    from reproduce.data import load_bible_verses

    done = folder / "done"
    if done.is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    train = [(v.source, v.target) for v in load_bible_verses("bible-en-de", "train")]

    def line(source: str, target: str) -> str:
        return json.dumps({"translation": {"en": source, "de": target}}, ensure_ascii=False) + "\n"

    with open(folder / "train.jsonl", "w") as f:
        for _ in range(pairs):
            i = rng.randrange(len(train) - 1)
            if rng.random() < 0.5:
                f.write(line(*train[i]))
            else:
                f.write(line(f"{train[i][0]} {train[i + 1][0]}", f"{train[i][1]} {train[i + 1][1]}"))
    for split, name, count in (("dev", "validation", 3000), ("test", "test", 3003)):
        verses = [(v.source, v.target) for v in load_bible_verses("bible-en-de", split)]
        with open(folder / f"{name}.jsonl", "w") as f:
            for k in range(count):
                f.write(line(*verses[k % len(verses)]))
    done.touch()
    return folder


def memory(cache: Path) -> dict[str, float]:
    """This process's anonymous memory, and the Rss and Pss of the cache's files mapped into it
    (``/proc/self/smaps``), in MB."""
    out = {"anonymous_mb": 0.0, "cache_rss_mb": 0.0, "cache_pss_mb": 0.0}
    mapped = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if not head:
                continue
            if not head[0].endswith(":"):  # a mapping's header: address range ... path
                mapped = head[5] if len(head) > 5 else ""
                continue
            if len(head) < 2 or not head[1].isdigit():
                continue  # VmFlags and the like
            key, kb = head[0], float(head[1]) / 1024
            if key == "Anonymous:":
                out["anonymous_mb"] += kb
            elif mapped and mapped.startswith(str(cache)) and key in ("Rss:", "Pss:"):
                out["cache_rss_mb" if key == "Rss:" else "cache_pss_mb"] += kb
    return {k: round(v, 1) for k, v in out.items()}


def rank_main(data_dir: str, cache: str, rank: int, world: int, started: float) -> None:
    """One rank of a later run: the data path of ``fit.build_data`` then one epoch's batches."""
    from types import SimpleNamespace

    from reproduce.config import Config
    from reproduce.data.module import TranslationData
    from reproduce.data.source import CorpusSource
    from reproduce.data.vocabulary import corpus_tokenizer

    source = CorpusSource("local-en-de", data_dir)
    tokenizer = corpus_tokenizer(source, VOCAB, cache)
    config = Config().overrides(corpus="local-en-de", batch_tokens=BATCH_TOKENS,
                                data_dir=str(data_dir))
    data = TranslationData(config, tokenizer, cache_dir=cache, source=source)
    # What the Trainer tells the data module: this process's rank, the epoch, the step.
    data.trainer = SimpleNamespace(global_rank=rank, world_size=world, current_epoch=0,
                                   accumulate_grad_batches=1, global_step=0)
    data.setup()
    batches = iter(data.train_dataloader())
    next(batches)
    first = time.time() - started
    at_first = memory(Path(cache))
    count, tokens, t0 = 1, 0, time.perf_counter()
    for batch in batches:
        count += 1
        tokens += batch["src"].numel()
    seconds = time.perf_counter() - t0
    print(json.dumps({"rank": rank, "to_first_batch_s": round(first, 1),
                      "memory_first_batch": at_first, "memory_after_epoch": memory(Path(cache)),
                      "batches": count, "batches_per_s": round((count - 1) / seconds, 1),
                      "padded_src_tokens_per_batch": round(tokens / max(count - 1, 1))}))


def first_run(data_dir: Path, cache: Path, hf: Path) -> dict[str, float]:
    """An empty cache, in a process of its own (its peak memory its own): the files'
    fingerprint, the BPE model (the first reading of the training text: ``datasets`` converts
    the JSON lines into its Arrow copy under ``hf``, then the text streams to sentencepiece),
    the encoding and writing of the cache (a second stream), each timed; the process's peak RSS
    and CPU seconds."""
    for folder in (cache, hf):
        subprocess.run(["rm", "-rf", str(folder)], check=True)
    out = subprocess.run([sys.executable, __file__, "--first", "--data", str(data_dir),
                          "--cache", str(cache)], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "HF_DATASETS_CACHE": str(hf)})
    if out.returncode:
        raise SystemExit(f"the first run failed (exit {out.returncode})")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["arrow_mb"] = round(sum(f.stat().st_size for f in hf.rglob("*.arrow")) / 1e6)
    return result


def first_main(data_dir: str, cache: str) -> None:
    import resource

    from reproduce.data.encoded_cache import encoded_corpus
    from reproduce.data.source import CorpusSource
    from reproduce.data.vocabulary import corpus_tokenizer

    times = {}
    t0 = time.perf_counter()
    source = CorpusSource("local-en-de", data_dir)
    source.fingerprint  # noqa: B018 - hashing the files is a stage of its own
    times["fingerprint_s"] = time.perf_counter() - t0
    t = time.perf_counter()
    tokenizer = corpus_tokenizer(source, VOCAB, cache)
    times["bpe_s"] = time.perf_counter() - t
    t = time.perf_counter()
    corpus = encoded_corpus(source, tokenizer, cache_dir=cache)
    times["encode_and_write_s"] = time.perf_counter() - t
    times["total_s"] = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out = {k: round(v, 1) for k, v in times.items()}
    out["cache_mb"] = round(sum(f.stat().st_size for f in corpus.folder.iterdir()) / 1e6)
    out["peak_rss_mb"] = round(usage.ru_maxrss / 1024)
    out["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 1)
    print(json.dumps(out), flush=True)


def later_run(data_dir: Path, cache: Path, world: int) -> list[dict]:
    """``world`` rank processes started together on a built cache; each reports its numbers."""
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(rank), "--world", str(world),
                               "--data", str(data_dir), "--cache", str(cache),
                               "--started", repr(time.time())],
                              stdout=subprocess.PIPE, text=True, env={**os.environ,
                                                                      "OMP_NUM_THREADS": "1"})
             for rank in range(world)]
    reports = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"a rank failed (exit {proc.returncode})")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def machine() -> str:
    cpu = platform.processor() or ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu}, {os.cpu_count()} cores, {memory_gb:.0f} GiB"


def report(results: list[dict], command: str) -> str:
    lines = ["# The data path at WMT's size", "",
             f"Machine: {machine()}. Command: `{command}` "
             f"({time.strftime('%Y-%m-%d')}; `benchmarks/data_scale.py` says what it measures).",
             "", "## First run: an empty cache", "",
             "One process per size: the files' fingerprint; the BPE model (37000 pieces; its "
             "stage includes the first reading of the text, `datasets`' conversion of the JSON "
             "lines into its Arrow copy, and the text streamed to sentencepiece, which samples "
             "2M sentences); the corpus streamed again, encoded and written into the cache; "
             "the process's peak RSS and CPU seconds (user + system).", "",
             "| pairs | train.jsonl | fingerprint | BPE (37000) | encode + write | total "
             "| CPU | CPU per 1M pairs | peak RSS | Arrow copy | cache |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        f = r["first"]
        lines.append(f"| {r['pairs']:,} | {r['train_mb']:,} MB | {f['fingerprint_s']} s "
                     f"| {f['bpe_s']} s | {f['encode_and_write_s']} s | {f['total_s']} s "
                     f"| {f['cpu_s']:.0f} s | {f['cpu_s'] / r['pairs'] * 1e6:.0f} s "
                     f"| {f['peak_rss_mb']:,} MB | {f['arrow_mb']:,} MB | {f['cache_mb']:,} MB |")
    lines += ["", extrapolation(results)]
    lines += ["", "The same first run through the CLI, then a later one: "
              "[first-run.md](first-run.md) (`benchmarks/first_run.py`)."]
    lines += ["", "## Later runs: the cache built", "",
              "Per rank: seconds from the process's start to its first batch; anonymous memory "
              "and the cache files' Rss / Pss at the first batch and after its share of one "
              "epoch's batches; batches per second over that pass (a rank's batches hold 25,000 "
              "tokens / ranks, padding included; their mean padded source tokens beside).", "",
              "| pairs | ranks | rank | to first batch | anonymous (first / epoch) "
              "| cache Rss / Pss (first) | cache Rss / Pss (epoch) | batches | tokens/batch "
              "| batches/s |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        for world, ranks in sorted(r["later"].items()):
            for k in ranks:
                a, b = k["memory_first_batch"], k["memory_after_epoch"]
                lines.append(
                    f"| {r['pairs']:,} | {world} | {k['rank']} | {k['to_first_batch_s']} s "
                    f"| {a['anonymous_mb']:,.0f} / {b['anonymous_mb']:,.0f} MB "
                    f"| {a['cache_rss_mb']:,.0f} / {a['cache_pss_mb']:,.0f} MB "
                    f"| {b['cache_rss_mb']:,.0f} / {b['cache_pss_mb']:,.0f} MB "
                    f"| {k['batches']:,} | {k['padded_src_tokens_per_batch']:,} "
                    f"| {k['batches_per_s']:,.0f} |")
    return "\n".join(lines) + "\n"


EN_FR_ROWS = 40_836_715  # the Hub's wmt/wmt14 fr-en train rows (records.footprint.KNOWN)


def extrapolation(results: list[dict]) -> str:
    """Table 2's EN-FR from the largest size measured, by a stated rule: seconds, CPU and the
    cache grow with the pairs (the per-pair rates of that size); peak RSS is taken as flat
    when the two largest sizes' figures are within 15 %, and otherwise not extrapolated."""
    big = max(results, key=lambda r: r["pairs"])
    f, scale = big["first"], EN_FR_ROWS / big["pairs"]
    line = (f"**EN-FR, extrapolated** ({EN_FR_ROWS:,} pairs, the Hub's `fr-en` rows; rule: "
            f"{big['pairs']:,} pairs' seconds, CPU and cache per pair times the pairs, on this "
            f"machine's {os.cpu_count()} cores): the first run's data stages "
            f"~{f['total_s'] * scale / 60:.0f} min, {f['cpu_s'] * scale / 3600:.1f} CPU-hours, "
            f"an encoded cache of ~{f['cache_mb'] * scale / 1e3:.1f} GB and a JSON-lines Arrow "
            f"copy of ~{f['arrow_mb'] * scale / 1e3:.1f} GB")
    sizes = sorted(results, key=lambda r: r["pairs"])
    if len(sizes) >= 2:
        a, b = sizes[-2]["first"]["peak_rss_mb"], sizes[-1]["first"]["peak_rss_mb"]
        if abs(b - a) <= 0.15 * a:
            return line + (f"; peak RSS as at {sizes[-1]['pairs']:,} pairs, ~{b:,} MB (it grew "
                           f"{(b - a) / a:+.0%} from {sizes[-2]['pairs']:,} pairs).")
        return line + (f"; peak RSS not extrapolated: it grew {(b - a) / a:+.0%} from "
                       f"{sizes[-2]['pairs']:,} to {sizes[-1]['pairs']:,} pairs.")
    return line + "."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, nargs="+",
                        default=[1_000_000, 4_500_000, 9_000_000])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--work", type=Path, default=Path("/tmp/data-scale"))
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "data-scale.md")
    parser.add_argument("--first", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--started", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    import logging
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.first:
        first_main(args.data, args.cache)
        return
    if args.rank is not None:
        rank_main(args.data, args.cache, args.rank, args.world, args.started)
        return
    os.environ.update({"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
    results = []
    for pairs in args.pairs:
        data_dir = generate(args.work / f"corpus-{pairs}", pairs)
        cache = args.work / f"cache-{pairs}"
        print(f"{pairs:,} pairs: first run", flush=True)
        first = first_run(data_dir, cache, args.work / f"hf-{pairs}")
        later = {}
        for world in args.ranks:
            print(f"{pairs:,} pairs: later run, {world} rank(s)", flush=True)
            later[world] = later_run(data_dir, cache, world)
        results.append({"pairs": pairs, "first": first, "later": later,
                        "train_mb": round((data_dir / "train.jsonl").stat().st_size / 1e6)})
        print(json.dumps(results[-1]), flush=True)
    command = "python benchmarks/data_scale.py " + " ".join(sys.argv[1:])
    args.out.write_text(report(results, command.strip()))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
