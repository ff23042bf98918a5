"""What a corpus takes before a run's first step, counted without reading it: the download still
to fetch, the Arrow copy ``datasets`` writes into its cache, the encoded cache, and the first
run's minutes of reading, BPE and encoding. ``--dry-run`` prints it (``plan.dry_run``), and
``room`` refuses, in one line, a run whose data would not fit on its disks before anything is
read (as ``disk`` does for checkpoints).

The rules, each from a measurement:

- **The Hub's WMT14**: the ``wmt/wmt14`` dataset card's sizes (``KNOWN``: de-en's download, Arrow
  size and rows). fr-en's card gives rows but no sizes here: its bytes are de-en's per row times
  its rows, said so.
- **Local JSON lines**: ``datasets``' Arrow copy is 0.93x the files' bytes, the encoded cache
  0.855x (a generated 200k-pair corpus: 81.8 MB of Arrow and 75 MB encoded from an 87.8 MB
  ``train.jsonl``, 2026-11-27; at 4.5M pairs 1,690 MB encoded from 1,977 MB,
  results/data-scale.md). Pairs are counted from the first MiB's bytes per line.
- **A Hub download in the Hub's layout** (parquet shards): Arrow is 1.66x the shards' bytes
  (de-en's card: 1.36 GB of Arrow from 0.82 GB of parquet), the encoded cache 0.92x the Arrow.
- **Time**: pairs over the rate per core of reading and encoding on this machine, from the
  encoded caches of 100k pairs or more it built (their ``meta.json``: pairs, ``encode_seconds``
  and ``cores``), else ``FIRST_RUN_RATE``: 4.5M generated pairs in 346.9 s on the 2-core Xeon
  (the files' fingerprint, the BPE and the streamed encoding, results/data-scale.md), 6,500
  pairs/s a core.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from reproduce import paths
from reproduce.config import Config
from reproduce.data.corpora import corpus_spec
from reproduce.data.hub import hub_download, hub_snapshot, local_file
from reproduce.errors import DataError, NoRoom
from reproduce.records import disk
from reproduce.util import machine
from reproduce.util.cache_folders import CacheEntry, cache_entries


@dataclass(frozen=True)
class Known:
    """A Hub dataset's figures from its card (bytes; None where the card gives none here)."""

    download: int | None
    arrow: int | None
    train_pairs: int


KNOWN = {"wmt14-en-de": Known(818_467_512, 1_359_920_533, 4_508_785),
         "wmt14-en-fr": Known(None, None, 40_836_715)}
ARROW_PER_JSON, ENCODED_PER_JSON = 0.93, 0.855
ARROW_PER_PARQUET = KNOWN["wmt14-en-de"].arrow / KNOWN["wmt14-en-de"].download  # type: ignore
FIRST_RUN_RATE = 4_500_000 / 346.9 / 2  # pairs per second per core, reading to encoded


@dataclass(frozen=True)
class Footprint:
    """A corpus's data before training, in bytes and seconds (0 where already on disk)."""

    corpus: str
    where: str
    download: int
    arrow: int
    encoded: int
    pairs: int
    seconds: float
    rate_source: str
    built: bool  # an encoded cache of it is there: nothing is read, downloaded or encoded

    def describe(self) -> str:
        if self.built:
            return f"{self.corpus} ({self.where}): encoded cache built; nothing to read or encode"
        fetch = f"download {disk.size(self.download)}, " if self.download else ""
        return (f"{self.corpus} ({self.where}): {fetch}datasets' Arrow copy "
                f"{disk.size(self.arrow)}, encoded cache {disk.size(self.encoded)}; the first "
                f"run reads and encodes ~{self.pairs:,} pairs in ~{_duration(self.seconds)} on "
                f"{machine.cores()} core(s) ({self.rate_source})")


def footprint(config: Config) -> Footprint | None:
    """The footprint of ``config``'s corpus; None for the small ones (the Bible, treebanks)."""
    d = config.data
    spec = corpus_spec(d.corpus)
    if spec.treebank or (spec.bible is not None and not d.data_dir):
        return None
    folder = Path(d.data_dir) if d.data_dir else hub_download(d.corpus, local_only=True)
    if folder is not None:
        where, download, arrow, encoded, pairs = _local(d.corpus, folder)
    else:
        known = KNOWN.get(d.corpus)
        if known is None:
            return None
        de = KNOWN["wmt14-en-de"]
        scale = known.train_pairs / de.train_pairs
        download = known.download or int(de.download * scale)  # type: ignore[operator]
        arrow = known.arrow or int(de.arrow * scale)  # type: ignore[operator]
        repo, pair = spec.hub  # type: ignore[misc]
        where = f"the Hub's {repo} {pair}" + ("" if known.download else
                                              ", sizes from de-en's per row")
        encoded, pairs = int(arrow * ENCODED_PER_JSON / ARROW_PER_JSON), known.train_pairs
    if d.max_train_pairs:
        pairs = min(pairs, d.max_train_pairs)
    pairs = pairs // d.train_every
    encoded_here = cache_entries(paths.cache_dir())
    rate, source = first_run_rate(encoded_here)
    built = any(e.corpus == d.corpus and e.data_dir == (d.data_dir or (folder and str(folder)))
                for e in encoded_here)
    return Footprint(d.corpus, where, 0 if built else download, 0 if built else arrow,
                     0 if built else encoded, pairs, 0.0 if built else
                     pairs / (rate * machine.cores()), source, built)


def room(run_id: str, config: Config) -> Footprint | None:
    """Raise ``NoRoom`` where ``config``'s data (download, Arrow copy, encoded cache) will not fit
    on the disks that hold the caches; its footprint otherwise."""
    f = footprint(config)
    if f is None or f.built or os.environ.get(disk.SKIP_ENV):
        return f
    from datasets import config as datasets_config  # where datasets keeps its Arrow copies

    wants = {paths.cache_dir(): f.encoded}
    hf = Path(datasets_config.HF_DATASETS_CACHE)
    wants[hf] = wants.get(hf, 0) + f.arrow + f.download
    for folder, need in wants.items():
        if need > (free := disk.free(folder)):
            raise NoRoom(f"{run_id}: its data needs {disk.size(need)} in {folder} ({f.describe()})"
                         f", which has {disk.size(free)} free: not started (nothing was read). "
                         "Make room, point the cache elsewhere (REPRODUCE_CACHE, "
                         "HF_DATASETS_CACHE), or start it anyway with --skip-disk-check")
    return f


def first_run_rate(encoded: list[CacheEntry]) -> tuple[float, str]:
    """Pairs per second per core of a first run's reading and encoding: the median over the
    ``encoded`` caches this machine built of 100k pairs or more (their pairs, seconds and cores),
    else ``FIRST_RUN_RATE``."""
    rates = [e.train_pairs / e.encode_seconds / e.cores for e in encoded
             if e.cores and e.encode_seconds and e.train_pairs >= 100_000]
    if rates:
        return statistics.median(rates), f"{statistics.median(rates):,.0f} pairs/s a core, " \
            f"measured by {len(rates)} encoded cache(s) here"
    return FIRST_RUN_RATE, f"{FIRST_RUN_RATE:,.0f} pairs/s a core, results/data-scale.md"


def _local(corpus: str, folder: Path) -> tuple[str, int, int, int, int]:
    """(where, download, Arrow, encoded, pairs) of files on disk: a Hub download, or JSON lines."""
    snapshot = hub_snapshot(corpus, folder)
    if snapshot is not None:
        import pyarrow.parquet as pq

        shards = snapshot.shards("train")
        parquet = sum(p.stat().st_size for p in shards)
        pairs = sum(pq.ParquetFile(p).metadata.num_rows for p in shards)
        arrow = int(parquet * ARROW_PER_PARQUET)
        return (f"{snapshot.repo} in {snapshot.folder}", 0, arrow,
                int(arrow * ENCODED_PER_JSON / ARROW_PER_JSON), pairs)
    try:
        train = local_file(corpus, folder, "train")
    except DataError:
        return f"local files in {folder}", 0, 0, 0, 0  # reading it says what is missing
    size = train.stat().st_size
    with open(train, "rb") as f:
        head = f.read(1 << 20)
    pairs = int(size * head.count(b"\n") / len(head)) if head else 0
    return (f"local files in {folder}", 0, int(size * ARROW_PER_JSON),
            int(size * ENCODED_PER_JSON), pairs)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
