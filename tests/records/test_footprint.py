"""records/footprint.py: what a corpus takes on disk and in time before a run's first step, counted
without reading it; a run whose data would not fit is refused in one line before anything is
read."""

import json

import pytest

from reproduce.config import Config
from reproduce.errors import NoRoom
from reproduce.records import disk, footprint
from reproduce.util.cache_folders import cache_entries


def _config(**data) -> Config:
    return Config.from_dict({"data": data})


def _corpus(folder, pairs: int):
    folder.mkdir()
    row = json.dumps({"translation": {"en": "In the beginning " * 3, "de": "Im Anfang " * 3}})
    (folder / "train.jsonl").write_text((row + "\n") * pairs)
    for name in ("validation", "test"):
        (folder / f"{name}.jsonl").write_text(row + "\n")
    return folder


def test_local_files_are_counted_from_their_bytes(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRODUCE_CACHE", str(tmp_path / "cache"))
    data = _corpus(tmp_path / "mine", 20_000)
    size = (data / "train.jsonl").stat().st_size
    f = footprint.footprint(_config(corpus="local-en-de", data_dir=str(data)))
    assert f is not None and not f.built and f.download == 0
    assert f.arrow == int(size * footprint.ARROW_PER_JSON)
    assert f.encoded == int(size * footprint.ENCODED_PER_JSON)
    assert f.pairs == pytest.approx(20_000, rel=0.01)
    assert f.seconds == pytest.approx(f.pairs / (footprint.FIRST_RUN_RATE * footprint.machine.cores()))
    assert "local files in" in f.describe() and "results/data-scale.md" in f.describe()
    half = footprint.footprint(_config(corpus="local-en-de", data_dir=str(data), train_every=2))
    assert half.pairs == f.pairs // 2
    # the Bible and treebanks: small, not counted
    assert footprint.footprint(_config(corpus="bible-en-de")) is None


def test_the_hubs_wmt14_is_priced_from_its_card(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRODUCE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # no snapshot on disk
    de = footprint.footprint(_config(corpus="wmt14-en-de"))
    assert (de.download, de.arrow, de.pairs) == (818_467_512, 1_359_920_533, 4_508_785)
    fr = footprint.footprint(_config(corpus="wmt14-en-fr"))
    assert fr.pairs == 40_836_715 and "sizes from de-en's per row" in fr.describe()
    assert fr.download == pytest.approx(de.download * 40_836_715 / 4_508_785, rel=1e-6)


def test_a_run_whose_data_would_not_fit_is_refused_before_anything_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRODUCE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(disk.SKIP_ENV, raising=False)
    data = _corpus(tmp_path / "mine", 20_000)
    config = _config(corpus="local-en-de", data_dir=str(data))
    monkeypatch.setattr(disk, "free", lambda folder: 1000)
    with pytest.raises(NoRoom, match=r"mine-run: its data needs .* free: not started \(nothing was "
                                     r"read\).*--skip-disk-check"):
        footprint.room("mine-run", config)
    monkeypatch.setenv(disk.SKIP_ENV, "1")
    assert footprint.room("mine-run", config) is not None  # --skip-disk-check
    monkeypatch.delenv(disk.SKIP_ENV)
    # once an encoded cache of it is built, nothing more is needed
    built = tmp_path / "cache" / "encoded" / "local-en-de-0123"
    built.mkdir(parents=True)
    (built / "meta.json").write_text(json.dumps({"corpus": "local-en-de", "data_dir": str(data),
                                                 "pairs": {"train": 20_000}}))
    assert footprint.room("mine-run", config).built
    assert "encoded cache built" in footprint.footprint(config).describe()


def test_the_rate_is_this_machines_once_it_has_encoded_a_large_corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRODUCE_CACHE", str(tmp_path / "cache"))
    for name, pairs, seconds in (("a", 200_000, 10.0), ("b", 400_000, 10.0), ("c", 5_000, 1.0)):
        folder = tmp_path / "cache" / "encoded" / name
        folder.mkdir(parents=True)
        (folder / "meta.json").write_text(json.dumps(
            {"pairs": {"train": pairs}, "encode_seconds": seconds, "cores": 2}))
    rate, source = footprint.first_run_rate(cache_entries(tmp_path / "cache"))
    assert rate == 15_000.0  # the median of 10,000 and 20,000 a core; "c" is too small to count
    assert "measured by 2 encoded cache(s) here" in source
