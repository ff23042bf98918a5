"""Translation pairs through Hugging Face ``datasets``: a corpus on the Hub (failing within ~2 s
when offline), a download of its repository on disk (``data_dir`` in the Hub's layout:
``<pair>/<split>-*.parquet``), or the same rows in local JSON-lines files (``data_dir``)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from reproduce.data.corpora import FILE_SPLITS, CorpusSpec, corpus_spec
from reproduce.errors import DataError

if TYPE_CHECKING:
    import datasets

# datasets is imported where a corpus is read: 1.9 s that rendering, status and --help never need.


def translation_dataset(
    corpus: str, split: str, data_dir: str | None
) -> tuple[datasets.Dataset, str]:
    """A split with a "translation" column from the Hub or local JSON lines, and its origin."""
    import datasets

    spec = corpus_spec(corpus)
    file_split = FILE_SPLITS[split]
    if data_dir is not None and (snapshot := hub_snapshot(corpus, data_dir)) is not None:
        return snapshot.dataset(file_split), snapshot.origin(file_split)
    if data_dir is not None:
        path = local_file(corpus, data_dir, file_split)
        if _blank(path):
            raise DataError(f"{path}: empty; it needs one JSON object per line, "
                            f'{{"translation": {{"{spec.source}": ..., "{spec.target}": ...}}}}')
        try:
            dataset = load_dataset("json", data_files={file_split: str(path)}, split=file_split)
        except datasets.exceptions.DatasetGenerationError as exc:
            raise DataError(f"{path}: not valid JSON lines ({exc.__cause__ or exc})") from exc
        return dataset, str(path)
    if spec.hub is None:
        raise _no_data_dir(corpus)
    name, config = spec.hub
    origin = f"{name} ({config}, {file_split})"
    with _hub_access() as offline:
        try:
            dataset = load_dataset(name, config, split=file_split)
        except (OSError, datasets.exceptions.DatasetNotFoundError) as exc:
            why = "offline and not in the local datasets cache" if offline else str(exc)
            raise DataError(
                f"could not fetch corpus {corpus!r} from the Hugging Face Hub ({origin}): {why};"
                f" point data_dir at a folder with train.jsonl, validation.jsonl and test.jsonl"
                f' whose rows are {{"translation": {{"{spec.source}": ..., "{spec.target}": ...}}}}'
            ) from exc
    return dataset, origin


def check_files(corpus: str, data_dir: str | None) -> None:
    """Raise the one-line ``DataError`` reading would, where a corpus read from local files
    lacks them (``data_dir`` missing, a split's file missing, or no ``data_dir`` where the corpus
    has no Hub name): a dry run and a sweep's start find it before anything runs. Treebanks, the
    Bible and the Hub's corpora without ``data_dir`` are their readers' to check."""
    spec = corpus_spec(corpus)
    if spec.treebank or (not data_dir and (spec.hub or spec.bible) is not None):
        return
    if not data_dir:
        raise _no_data_dir(corpus)
    snapshot = hub_snapshot(corpus, data_dir)
    for file_split in FILE_SPLITS.values():
        if snapshot is None:
            local_file(corpus, data_dir, file_split)
        else:
            snapshot.shards(file_split)


def check_data(configs) -> None:
    """``check_files`` for each corpus the run configs ``configs`` read, once each."""
    for corpus, data_dir in {(c.data.corpus, c.data.data_dir) for c in configs}:
        check_files(corpus, data_dir)


def _no_data_dir(corpus: str) -> DataError:
    spec = corpus_spec(corpus)
    return DataError(f"corpus {corpus!r} reads local files: set data_dir to a folder with "
                     "train.jsonl, validation.jsonl and test.jsonl whose rows are "
                     f'{{"translation": {{"{spec.source}": ..., "{spec.target}": ...}}}}')


def _blank(path: Path) -> bool:
    """Whether ``path`` holds nothing but white space, read a block at a time: a 4 GB file read
    whole to ask this took 4-8 GB of memory, the peak of a first run at 9M pairs."""
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 16), b""):
            if block.strip():
                return False
    return True


def load_dataset(*args: Any, **kwargs: Any) -> datasets.Dataset:
    """The one entry point for Hub names and local files alike: ``datasets.load_dataset``."""
    import datasets

    return datasets.load_dataset(*args, **kwargs)


@dataclass(frozen=True)
class Snapshot:
    """A download of a corpus's Hub repository: ``folder`` holds ``<split>-*.parquet`` shards of
    one configuration (``wmt/wmt14``'s ``de-en/``), as ``hf download REPO --repo-type dataset
    --include 'de-en/*'`` leaves them (``--local-dir``, or the Hub cache's
    ``snapshots/<revision>/``). The repository and revision are what the folder tells."""

    folder: Path
    repo: str
    revision: str | None

    def shards(self, file_split: str) -> list[Path]:
        shards = sorted(self.folder.glob(f"{file_split}-*.parquet"))
        if not shards:
            have = sorted({p.name.split("-", 1)[0] for p in self.folder.glob("*.parquet")})
            raise DataError(f"{self.folder}: no {file_split}-*.parquet shard (has {have}); a "
                            f"download of {self.repo} holds train, validation and test")
        return shards

    def origin(self, file_split: str) -> str:
        at = f"@{self.revision[:12]}" if self.revision else ""
        return f"{self.repo}{at} ({self.folder.name}, {file_split}) in {self.folder}"

    def dataset(self, file_split: str) -> datasets.Dataset:
        """The split's shards through ``datasets``' parquet builder, as the Hub's are read."""
        import datasets

        shards = self.shards(file_split)
        try:
            return load_dataset("parquet", data_files={file_split: [str(p) for p in shards]},
                                split=file_split)
        except (datasets.exceptions.DatasetGenerationError, OSError, ValueError) as exc:
            bad = next((p for p in shards if _unreadable_parquet(p)), shards[0].parent)
            raise DataError(f"{bad}: not a readable parquet shard of {self.repo} "
                            f"({exc.__cause__ or exc}); download it again") from exc


def hub_snapshot(corpus: str, data_dir: str | Path) -> Snapshot | None:
    """``data_dir`` as a download of ``corpus``'s Hub repository, or None when it holds no
    parquet shards (then it is read as JSON lines). A download of the repository without this
    corpus's language pair is refused in one line that says how to fetch it."""
    spec = corpus_spec(corpus)
    root = Path(data_dir)
    if spec.hub is None or not root.is_dir():
        return None
    repo, config = spec.hub
    pairs = sorted(p.name for p in root.iterdir() if p.is_dir() and any(p.glob("*.parquet")))
    if not pairs:
        return None
    if config not in pairs:
        raise DataError(f"{root}: a download of the Hub's layout with {pairs} but not {config}/, "
                        f"which corpus {corpus!r} reads; fetch it with `hf download {repo} "
                        f"--repo-type dataset --include '{config}/*' --local-dir {root}`")
    cached = root.parent.name == "snapshots" and root.parent.parent.name.startswith("datasets--")
    if cached:  # the Hub cache: <cache>/datasets--wmt--wmt14/snapshots/<revision>/
        repo = root.parent.parent.name.removeprefix("datasets--").replace("--", "/")
    return Snapshot(root / config, repo, root.name if cached else _local_dir_revision(root, config))


@lru_cache(maxsize=8)
def hub_download(corpus: str, local_only: bool = False) -> Path | None:
    """The Hub's files of ``corpus`` on this machine, downloaded first where the Hub is reachable:
    huggingface_hub's snapshot of the repository's language pair (its cache's
    ``snapshots/<revision>/``, a layout ``hub_snapshot`` reads). So a corpus read from the Hub and
    the same files given as ``data_dir`` are one corpus: one fingerprint (the shards' SHA-256),
    one BPE model and one encoded cache, and the record names the revision either way. None
    where there is no such snapshot (offline without one, a Hub that refused): then ``datasets``
    is asked by name, as before, and says what is wrong. ``local_only``: the snapshot already on
    this machine, never a download (a plan counts what is there)."""
    spec = corpus_spec(corpus)
    if spec.hub is None:
        return None
    repo, config = spec.hub
    from huggingface_hub import snapshot_download

    with contextlib.nullcontext(True) if local_only else _hub_access() as offline:
        try:
            folder = Path(snapshot_download(repo_id=repo, repo_type="dataset",
                                            allow_patterns=[f"{config}/*"],
                                            local_files_only=offline))
        except Exception:  # noqa: BLE001 - no snapshot here: the datasets path reports why
            return None
    return folder if any((folder / config).glob("*.parquet")) else None


def _local_dir_revision(root: Path, config: str) -> str | None:
    """The commit a ``--local-dir`` download came from: the first line of the metadata
    huggingface_hub keeps beside it (``.cache/huggingface/download/<file>.metadata``)."""
    for meta in sorted((root / ".cache" / "huggingface" / "download" / config).glob("*.metadata")):
        with contextlib.suppress(OSError, IndexError):
            return meta.read_text().splitlines()[0].strip() or None
    return None


def _unreadable_parquet(path: Path) -> bool:
    import pyarrow.parquet as pq

    try:
        pq.ParquetFile(path).metadata  # noqa: B018 - reads the footer: truncated files fail here
    except Exception:  # noqa: BLE001 - any failure to read is the answer
        return True
    return False


def local_files(corpus: str, data_dir: str) -> dict[str, dict[str, Any]]:
    """What a run on local files read: per split, the file, its size and its SHA-256 (a Hub
    download: its shards, each with its SHA-256, which is its LFS id on the Hub, and the
    SHA-256 of their list)."""
    if (snapshot := hub_snapshot(corpus, data_dir)) is not None:
        return _snapshot_files(snapshot)
    out = {}
    for split, file_split in FILE_SPLITS.items():
        path = local_file(corpus, data_dir, file_split)
        stat = path.stat()
        out[split] = {"file": str(path), "bytes": stat.st_size,
                      "sha256": file_sha256(str(path.resolve()), stat.st_size, stat.st_mtime_ns)}
    return out


def _snapshot_files(snapshot: Snapshot) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for split, file_split in FILE_SPLITS.items():
        shards: list[dict[str, Any]] = []
        for path in snapshot.shards(file_split):
            shards.append({"name": path.name, "bytes": path.stat().st_size,
                           "sha256": _shard_sha256(path)})
        out[split] = {"file": str(snapshot.folder / f"{file_split}-*.parquet"),
                      "bytes": sum(s["bytes"] for s in shards),
                      "sha256": hashlib.sha256("\n".join(s["sha256"] for s in shards).encode())
                      .hexdigest(),
                      "shards": shards, "repo": snapshot.repo, "revision": snapshot.revision}
    return out


def _shard_sha256(path: Path) -> str:
    """A shard's SHA-256. In huggingface_hub's cache a shard is a link to ``blobs/<LFS id>``, the
    SHA-256 the Hub gave the file and huggingface_hub checked on download: read from the name,
    so that ``status`` does not hash gigabytes of shards in every process. Else hashed."""
    real = path.resolve()
    if real.parent.name == "blobs" and re.fullmatch(r"[0-9a-f]{64}", real.name):
        return real.name
    stat = real.stat()
    return file_sha256(str(real), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=64)
def file_sha256(path: str, size: int, mtime_ns: int) -> str:
    """SHA-256 of a file's bytes, hashed once per process while its size and mtime stay the same
    (a 1.7 GB train.jsonl takes seconds; a run asks for it more than once)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def local_file(corpus: str, data_dir: str | Path, file_split: str) -> Path:
    """``data_dir``'s file of ``file_split`` (``<file_split>.jsonl`` or ``.json``), or a one-line
    ``DataError`` naming what is missing."""
    folder = Path(data_dir)
    if not folder.is_dir():
        raise DataError(f"data_dir for corpus {corpus!r} is not a directory: {folder}")
    for suffix in (".jsonl", ".json"):
        path = folder / f"{file_split}{suffix}"
        if path.is_file():
            return path
    hub = corpus_spec(corpus).hub
    raise DataError(
        f"missing file {folder / (file_split + '.jsonl')} for corpus {corpus!r} (data_dir needs"
        " train.jsonl, validation.jsonl and test.jsonl"
        + (f", or a download of {hub[0]} in the Hub's layout: {hub[1]}/train-*.parquet, "
           "validation-*.parquet and test-*.parquet" if hub else "") + ")"
    )


def translation_columns(
    dataset: datasets.Dataset, spec: CorpusSpec, origin: str
) -> tuple[list[str | None], list[str | None]]:
    """Source and target texts from ``{"translation": {lang: text}}`` rows."""
    _check_translation(dataset, spec, origin)
    return _texts(dataset.select_columns(["translation"]).with_format("arrow")[:], spec)


def translation_batches(
    dataset: datasets.Dataset, spec: CorpusSpec, origin: str, rows: int = 65536
) -> Iterator[tuple[list[str | None], list[str | None]]]:
    """``translation_columns`` about ``rows`` rows at a time, in order, the corpus never held
    whole: read from the dataset's Arrow files as a stream (a memory-mapped 2 GB file read
    through would stay in the process's resident pages), or batched from the dataset where it
    has no files of its own."""
    _check_translation(dataset, spec, origin)
    for table in _arrow_tables(dataset, rows):
        yield _texts(table, spec)


def _check_translation(dataset: datasets.Dataset, spec: CorpusSpec, origin: str) -> None:
    if "translation" not in dataset.column_names:
        raise DataError(
            f'{origin}: rows have no "translation" field (fields: {dataset.column_names});'
            f' expected {{"translation": {{"{spec.source}": ..., "{spec.target}": ...}}}}'
        )
    fields = dataset.features["translation"]
    languages = list(getattr(fields, "languages", None) or getattr(fields, "keys", list)())
    missing = [lang for lang in (spec.source, spec.target) if lang not in languages]
    if missing:
        raise DataError(
            f'{origin}: "translation" has no {missing} field (has {languages});'
            f" expected {spec.source!r} and {spec.target!r}"
        )


def _texts(table: Any, spec: CorpusSpec) -> tuple[list[str | None], list[str | None]]:
    flat = table.select(["translation"]).flatten()
    return (flat.column(f"translation.{spec.source}").to_pylist(),
            flat.column(f"translation.{spec.target}").to_pylist())


def _arrow_tables(dataset: datasets.Dataset, rows: int) -> Iterator[Any]:
    """``dataset``'s rows as Arrow tables of about ``rows`` rows each, in order."""
    import pyarrow as pa

    files = [f["filename"] for f in dataset.cache_files]
    if not files or dataset._indices is not None:  # in memory, or a selection of its rows
        yield from dataset.with_format("arrow").iter(batch_size=rows)
        return
    pending = None  # rows read and not yet given: fewer than ``rows`` plus one record batch
    for name in files:
        with pa.OSFile(name) as f:
            for batch in pa.ipc.open_stream(f):
                table = pa.Table.from_batches([batch])
                pending = table if pending is None else pa.concat_tables([pending, table])
                while pending.num_rows >= rows:
                    yield pending.slice(0, rows)
                    pending = pending.slice(rows)
    if pending is not None and pending.num_rows:
        yield pending


_OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


_TRUE = {"1", "ON", "YES", "TRUE"}


def _env_offline() -> bool:
    return any(os.environ.get(var, "").upper() in _TRUE for var in _OFFLINE_VARS)


@lru_cache(maxsize=1)
def hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the Hub's host accepts a TCP connection, decided within about ``timeout`` seconds."""
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = url.port or (80 if url.scheme == "http" else 443)
    reached: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((url.hostname, port), timeout=timeout).close()
            reached.append(True)
        except OSError:
            reached.append(False)

    # A thread bounds the DNS lookup too, which the socket timeout does not cover.
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return bool(reached and reached[0])


@contextlib.contextmanager
def _hub_access() -> Iterator[bool]:
    """Yield whether the Hub is offline; if so, ``datasets`` is put in offline mode meanwhile.

    Without offline mode an unreachable Hub costs ~25 s of retries before failing. The flags are
    read when ``datasets`` is imported, so they are patched in its modules as well as the
    environment, and restored afterwards.
    """
    if not (_env_offline() or not hub_reachable()):
        yield False
        return
    import datasets.config
    import huggingface_hub.constants

    saved_env = {var: os.environ.get(var) for var in _OFFLINE_VARS}
    flags = [
        (datasets.config, "HF_HUB_OFFLINE"),
        (datasets.config, "HF_DATASETS_OFFLINE"),
        (huggingface_hub.constants, "HF_HUB_OFFLINE"),
    ]
    saved_flags = [getattr(module, name) for module, name in flags]
    os.environ.update(dict.fromkeys(_OFFLINE_VARS, "1"))
    for module, name in flags:
        setattr(module, name, True)
    try:
        yield True
    finally:
        for (module, name), value in zip(flags, saved_flags, strict=True):
            setattr(module, name, value)
        for var, value in saved_env.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """Silence datasets' progress bars for the quick local Bible builds."""
    import datasets

    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()
