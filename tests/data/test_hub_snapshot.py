"""A download of a corpus's Hub repository as ``data_dir`` (issue 51, item 1): the Hub's layout
(``de-en/train-0000N-of-0000M.parquet``, ``validation-*``, ``test-*``), generated here in that
layout from the offline Bible and read through ``datasets`` with nothing replaced."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reproduce.data import load_pairs, local_files
from reproduce.data.hub import hub_snapshot
from reproduce.data.source import CorpusSource
from reproduce.errors import DataError

REVISION = "0123456789abcdef0123456789abcdef01234567"


def _shard(path: Path, pairs: list[tuple[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = pa.array([{"de": de, "en": en} for en, de in pairs])
    pq.write_table(pa.table({"translation": rows}), path)


def write_snapshot(root: Path, train_shards: int = 3, metadata: bool = True) -> Path:
    """``root`` as `hf download wmt/wmt14 --repo-type dataset --include 'de-en/*' --local-dir`
    leaves it: the pair's shards and huggingface_hub's metadata of the commit (no README)."""
    train = load_pairs("bible-en-de", "train")[:2400]
    per = -(-len(train) // train_shards)
    for k in range(train_shards):
        _shard(root / "de-en" / f"train-{k:05d}-of-{train_shards:05d}.parquet",
               train[k * per:(k + 1) * per])
    _shard(root / "de-en" / "validation-00000-of-00001.parquet", load_pairs("bible-en-de", "dev")[:60])
    _shard(root / "de-en" / "test-00000-of-00001.parquet", load_pairs("bible-en-de", "test")[:60])
    if metadata:
        meta = root / ".cache" / "huggingface" / "download" / "de-en"
        meta.mkdir(parents=True)
        (meta / "train-00000-of-00003.parquet.metadata").write_text(f"{REVISION}\netag\n1.0\n")
    return root


def test_a_local_dir_download_reads_as_the_corpus_with_its_repository_and_revision(tmp_path):
    root = write_snapshot(tmp_path / "wmt14")
    snapshot = hub_snapshot("wmt14-en-de", root)
    assert (snapshot.repo, snapshot.revision) == ("wmt/wmt14", REVISION)
    pairs = load_pairs("wmt14-en-de", "train", str(root))
    assert pairs == load_pairs("bible-en-de", "train")[:2400]  # every shard, in order
    files = local_files("wmt14-en-de", str(root))
    assert [s["name"] for s in files["train"]["shards"]] == [
        f"train-{k:05d}-of-00003.parquet" for k in range(3)]
    assert files["train"]["repo"] == "wmt/wmt14" and files["test"]["revision"] == REVISION
    # the content names the caches: the same shards elsewhere give the same fingerprint
    moved = root.rename(tmp_path / "elsewhere")
    assert (CorpusSource("wmt14-en-de", str(moved)).fingerprint
            == CorpusSource("wmt14-en-de", str(write_snapshot(tmp_path / "again"))).fingerprint)


def test_the_hub_cache_names_repository_and_revision_by_its_folders(tmp_path):
    root = write_snapshot(tmp_path / "datasets--wmt--wmt14" / "snapshots" / "abc123", metadata=False)
    snapshot = hub_snapshot("wmt14-en-de", root)
    assert (snapshot.repo, snapshot.revision) == ("wmt/wmt14", "abc123")


def test_bad_downloads_are_one_line(tmp_path):
    fr = tmp_path / "fr"
    _shard(fr / "fr-en" / "train-00000-of-00001.parquet", [("a", "b")])
    with pytest.raises(DataError, match=r"with \['fr-en'\] but not de-en/.*hf download wmt/wmt14 "
                       r"--repo-type dataset --include 'de-en/\*'"):
        load_pairs("wmt14-en-de", "train", str(fr))
    with pytest.raises(DataError, match=r"train.jsonl.*or a download of wmt/wmt14 in the Hub's "
                       r"layout: de-en/train-\*.parquet"):
        load_pairs("wmt14-en-de", "train", str(tmp_path))  # neither layout
    root = write_snapshot(tmp_path / "cut", metadata=False)
    shard = root / "de-en" / "train-00001-of-00003.parquet"
    shard.write_bytes(shard.read_bytes()[:500])  # truncated: its footer is gone
    with pytest.raises(DataError, match="train-00001-of-00003.parquet: not a readable parquet"):
        load_pairs("wmt14-en-de", "train", str(root))


@pytest.mark.slow
def test_table2_base_trains_on_a_download_through_the_cli(tmp_path):
    root = write_snapshot(tmp_path / "wmt14")
    spec = tmp_path / "wmt.yaml"
    spec.write_text(f"table: wmt-download\nkind: table2\nsplit: test\n"
                    f"base: {{corpus: wmt14-en-de, data_dir: {root}}}\n"
                    "variants:\n  base-en-de: {set: {average_last: 5}, paper: {bleu: 27.3}}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPRODUCE_")}
    # no --variant: a spec without rows runs every variant
    out = subprocess.run([sys.executable, "-m", "reproduce", "table2", "--spec", str(spec),
                          "--scale", "smoke", "--results", str(tmp_path / "mine"), "--workers", "1"],
                         env={**env, "REPRODUCE_CACHE": str(tmp_path / "cache")},
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    record = json.loads((tmp_path / "mine" / "wmt-download"
                         / "wmt-download-base-en-de-smoke-seed0.json").read_text())
    assert record["data"]["corpus"] == "wmt14-en-de"
    assert record["data"]["files"]["train"]["revision"] == REVISION
    assert record["data"]["train_pairs"] + record["data"]["dropped_train_pairs"] == 2000
    page = (tmp_path / "mine" / "wmt-download.md").read_text()
    assert f"a download of wmt/wmt14@{REVISION[:12]} in `{root}`" in page


def test_the_hub_s_own_snapshot_is_the_same_corpus_as_the_same_download_in_a_folder(
        tmp_path, monkeypatch):
    # what `datasets`/`hf download` leave in the Hub cache: <cache>/datasets--wmt--wmt14/
    # snapshots/<revision>/de-en/*.parquet and refs/main; read offline, through huggingface_hub
    import huggingface_hub.constants

    from reproduce.data import hub
    from reproduce.train.fit import local_data

    cache = tmp_path / "hub"
    write_snapshot(cache / "datasets--wmt--wmt14" / "snapshots" / REVISION, metadata=False)
    (cache / "datasets--wmt--wmt14" / "refs").mkdir()
    (cache / "datasets--wmt--wmt14" / "refs" / "main").write_text(REVISION)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    hub.hub_download.cache_clear()
    from_hub = CorpusSource("wmt14-en-de")  # no data_dir: the Hub, as the spec names it
    assert from_hub.data_dir == str(cache / "datasets--wmt--wmt14" / "snapshots" / REVISION)
    folder = write_snapshot(tmp_path / "download")  # the same shards, downloaded to a folder
    assert from_hub.fingerprint == CorpusSource("wmt14-en-de", str(folder)).fingerprint
    assert from_hub.pairs("dev") == load_pairs("bible-en-de", "dev")[:60]
    files = local_data("wmt14-en-de", from_hub.data_dir)["files"]
    assert (files["train"]["repo"], files["train"]["revision"]) == ("wmt/wmt14", REVISION)
    hub.hub_download.cache_clear()


def test_a_record_from_the_hub_s_snapshot_is_stale_once_a_later_download_holds_other_shards(
        tmp_path, monkeypatch):
    # a corpus named without data_dir reads the snapshot refs/main points at; a later download
    # moves refs/main to a new revision's folder: other shards there make the record stale
    import huggingface_hub.constants

    from reproduce.config import Config
    from reproduce.data import hub
    from reproduce.records.store import data_changed, files_now

    repo = tmp_path / "hub" / "datasets--wmt--wmt14"
    write_snapshot(repo / "snapshots" / REVISION, metadata=False)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = Config().overrides(corpus="wmt14-en-de")
    hub.hub_download.cache_clear()
    try:
        then = files_now(config)
        assert then is not None and then["train"]["revision"] == REVISION
        record = {"data": {"files": then}}
        assert data_changed(record, config) is None
        later = "fedcba9876543210fedcba9876543210fedcba98"
        write_snapshot(repo / "snapshots" / later, train_shards=2, metadata=False)  # 2 shards: other files
        (repo / "refs" / "main").write_text(later)
        hub.hub_download.cache_clear()
        why = data_changed(record, config)
        assert why is not None and why.startswith("its train data (") and "changed since" in why
        assert f"snapshots/{later}/de-en/train-*.parquet" in why
        assert data_changed(record, Config().overrides(corpus="bible-en-de")) is None
    finally:
        hub.hub_download.cache_clear()


def test_a_shard_in_the_hub_cache_is_named_by_its_blob_not_hashed_again(tmp_path, monkeypatch):
    # huggingface_hub's cache: snapshots/<rev>/de-en/<shard> -> ../../../blobs/<sha256 of it>
    import hashlib

    from reproduce.data import hub

    repo = tmp_path / "datasets--wmt--wmt14"
    snapshot = write_snapshot(repo / "snapshots" / REVISION, metadata=False)
    (repo / "blobs").mkdir()
    digests = {}
    for shard in sorted((snapshot / "de-en").glob("*.parquet")):
        digest = hashlib.sha256(shard.read_bytes()).hexdigest()
        shard.rename(repo / "blobs" / digest)
        shard.symlink_to(os.path.relpath(repo / "blobs" / digest, shard.parent))
        digests[shard.name] = digest
    monkeypatch.setattr(hub, "file_sha256", lambda *a: pytest.fail(f"hashed {a[0]}"))
    files = local_files("wmt14-en-de", str(snapshot))
    assert {s["name"]: s["sha256"] for s in files["train"]["shards"]} == \
        {k: v for k, v in digests.items() if k.startswith("train-")}
    # the same bytes elsewhere (a --local-dir download) are hashed, to the same fingerprint
    monkeypatch.undo()
    copy = write_snapshot(tmp_path / "download")
    assert CorpusSource("wmt14-en-de", str(copy)).fingerprint == \
        CorpusSource("wmt14-en-de", str(snapshot)).fingerprint
