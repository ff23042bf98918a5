"""Encode once, map everywhere (reproduce.data.encoded_cache): the encoded corpus is built once per content
and vocabulary, mapped by later runs, tables and ranks; new content gets a new vocabulary and a
new cache; a killed or damaged build is rebuilt, never read; batches are the same from workers."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from reproduce.data import encoded_cache as encoded_cache
from reproduce.data import load_bible_verses
from reproduce.data.encoded_cache import encoded_corpus, read_cache
from reproduce.data.module import LOADER_WORKERS_ENV
from reproduce.data.source import CorpusSource
from reproduce.data.token_file import TokenFile
from reproduce.data.vocabulary import corpus_tokenizer
from reproduce.errors import DataError
from tests.helpers import data_module

FORK = multiprocessing.get_context("fork")


def _write_corpus(folder: Path, pairs: dict[str, list[tuple[str, str]]]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for split, name in (("train", "train"), ("dev", "validation"), ("test", "test")):
        rows = [json.dumps({"translation": {"en": s, "de": t}}) for s, t in pairs[split]]
        (folder / f"{name}.jsonl").write_text("\n".join(rows) + "\n")
    return str(folder)


@pytest.fixture(scope="module")
def verses() -> dict[str, list[tuple[str, str]]]:
    return {split: [(v.source, v.target) for v in load_bible_verses("bible-en-de", split)[:n]]
            for split, n in (("train", 400), ("dev", 30), ("test", 30))}


@pytest.fixture()
def corpus(tmp_path, verses) -> str:
    return _write_corpus(tmp_path / "corpus", verses)


def _source(data_dir: str) -> CorpusSource:
    return CorpusSource("local-en-de", data_dir)


def _count_encodes(monkeypatch) -> list[int]:
    calls: list[int] = []
    build = encoded_cache._build

    def counted(*args, **kwargs):
        calls.append(os.getpid())
        return build(*args, **kwargs)

    monkeypatch.setattr(encoded_cache, "_build", counted)
    return calls


def test_a_corpus_is_encoded_once_and_mapped_by_every_later_run_and_table(tmp_path, corpus,
                                                                        monkeypatch):
    cache = tmp_path / "cache"
    tokenizer = corpus_tokenizer(_source(corpus), 300, cache)
    calls = _count_encodes(monkeypatch)
    source = _source(corpus)
    first = encoded_corpus(source, tokenizer, cache_dir=cache)
    assert len(calls) == 1 and first.folder is not None and first.folder.parent == cache / "encoded"
    assert isinstance(first.train.src.tokens, TokenFile)  # read as needed, not a private copy
    assert "train" not in source._pairs  # nor is the text the first run read held any longer
    # A later run (a new reading of the same files): nothing encoded, the same arrays.
    again = encoded_corpus(_source(corpus), corpus_tokenizer(_source(corpus), 300, cache),
                           cache_dir=cache)
    assert len(calls) == 1 and again.folder == first.folder
    every = np.arange(len(first.train))
    assert np.array_equal(again.train.tgt.pieces(every), first.train.tgt.pieces(every))
    assert again.dev_pairs == first.dev_pairs and again.sha256 == first.sha256
    # Another table's data module (its own batch and length limit) maps the same folder.
    dm = data_module("local-en-de", tokenizer, batch_tokens=700, max_tokens_per_sentence=40,
                     data_dir=corpus, cache_dir=cache)
    dm.setup()
    assert len(calls) == 1 and dm.cache_folder == first.folder
    assert dm.num_train_pairs + dm.dropped == 400
    # A whole-corpus statistic is computed once and kept beside the arrays.
    ppl = dm.reference_perplexities()
    assert json.loads((first.folder / "reference_ppl-40.json").read_text()) == ppl
    # Another selection of the same corpus is another cache.
    fewer = encoded_corpus(_source(corpus), tokenizer, max_train_pairs=100, cache_dir=cache)
    assert len(calls) == 2 and fewer.folder != first.folder and len(fewer.train) == 100


def _build_in_child(data_dir: str, cache: str, calls: str) -> None:
    build = encoded_cache._build

    def slow(*args, **kwargs):
        with open(calls, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(1.0)  # long enough for the other rank to find the lock held
        return build(*args, **kwargs)

    encoded_cache._build = slow
    source = _source(data_dir)
    corpus = encoded_corpus(source, corpus_tokenizer(source, 300, cache), cache_dir=cache)
    assert corpus.folder is not None and len(corpus.train) == 400


def test_ranks_starting_together_build_once_and_map_the_same_folder(tmp_path, corpus):
    cache = tmp_path / "cache"
    corpus_tokenizer(_source(corpus), 300, cache)  # as the first rank to get there would
    calls = tmp_path / "calls"
    ranks = [FORK.Process(target=_build_in_child, args=(corpus, str(cache), str(calls)))
             for _ in range(2)]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join(60)
    assert [rank.exitcode for rank in ranks] == [0, 0]
    assert len(calls.read_text().split()) == 1  # one rank encoded; the other waited and mapped
    assert len([p for p in (cache / "encoded").iterdir() if p.is_dir()]) == 1


def test_new_content_in_the_same_files_gets_a_new_vocabulary_and_cache(tmp_path, verses):
    cache = tmp_path / "cache"
    data_dir = _write_corpus(tmp_path / "corpus", verses)
    tokenizer = corpus_tokenizer(_source(data_dir), 300, cache)
    before = encoded_corpus(_source(data_dir), tokenizer, cache_dir=cache)
    # The same path, other text: the train split reversed word by word.
    flipped = {**verses, "train": [(" ".join(s.split()[::-1]), " ".join(t.split()[::-1]))
                                   for s, t in verses["train"][:300]]}
    _write_corpus(tmp_path / "corpus", flipped)
    source = _source(data_dir)
    other = corpus_tokenizer(source, 300, cache)
    assert other.sha256 != tokenizer.sha256  # retrained on the new text, not the old model
    after = encoded_corpus(source, other, cache_dir=cache)
    assert after.folder != before.folder and len(after.train) == 300
    assert after.sha256["train"] != before.sha256["train"]


def _killed_mid_write(data_dir: str, cache: str) -> None:
    save = np.save

    def save_then_hang(file, array):
        save(file, array)
        os.kill(os.getpid(), signal.SIGKILL)  # killed after its first array, as kill -9 would

    np.save = save_then_hang
    source = _source(data_dir)
    encoded_corpus(source, corpus_tokenizer(source, 300, cache), cache_dir=cache)


def test_a_killed_or_damaged_build_is_rebuilt_never_read(tmp_path, corpus, monkeypatch):
    cache = tmp_path / "cache"
    tokenizer = corpus_tokenizer(_source(corpus), 300, cache)
    child = FORK.Process(target=_killed_mid_write, args=(corpus, str(cache)))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    left = [p.name for p in (cache / "encoded").iterdir() if p.is_dir()]
    assert len(left) == 1 and ".tmp-" in left[0]  # half written, never under the real name
    calls = _count_encodes(monkeypatch)
    corpus_ = encoded_corpus(_source(corpus), tokenizer, cache_dir=cache)
    assert len(calls) == 1 and len(corpus_.train) == 400
    assert [p.name for p in (cache / "encoded").iterdir() if p.is_dir()] == [corpus_.folder.name]
    # A complete folder whose array lost its tail (a disk error, a partial copy): rebuilt.
    tokens = corpus_.folder / "train.tgt.tokens.npy"
    expected = np.load(tokens)
    with open(tokens, "r+b") as f:
        f.truncate(tokens.stat().st_size - 8)
    assert read_cache(corpus_.folder) is None and not corpus_.folder.exists()
    rebuilt = encoded_corpus(_source(corpus), tokenizer, cache_dir=cache)
    assert len(calls) == 2 and np.array_equal(np.load(rebuilt.folder / tokens.name), expected)


def test_the_hub_path_goes_through_the_same_cache(tmp_path, verses, monkeypatch):
    """A saved Arrow dataset stands in for wmt/wmt14 on the Hub (no network here)."""
    import datasets

    from reproduce.data import hub

    saved = tmp_path / "wmt14"
    datasets.DatasetDict({
        name: datasets.Dataset.from_dict({"translation": [{"en": s, "de": t}
                                                          for s, t in verses[split]]})
        for split, name in (("train", "train"), ("dev", "validation"), ("test", "test"))
    }).save_to_disk(str(saved))
    asked = []

    def from_disk(name, config=None, split=None, **_):
        asked.append((name, config, split))
        return datasets.load_from_disk(str(saved))[split]

    monkeypatch.setattr(hub, "load_dataset", from_disk)
    cache = tmp_path / "cache"
    source = CorpusSource("wmt14-en-de")
    tokenizer = corpus_tokenizer(source, 300, cache)
    assert ("wmt/wmt14", "de-en", "train") in asked
    calls = _count_encodes(monkeypatch)
    first = encoded_corpus(source, tokenizer, cache_dir=cache)
    second = CorpusSource("wmt14-en-de")
    assert second.fingerprint == source.fingerprint  # datasets' own fingerprints, no reading
    again = encoded_corpus(second, corpus_tokenizer(second, 300, cache), cache_dir=cache)
    assert len(calls) == 1 and again.folder == first.folder and len(again.train) == 400


def test_batches_from_loader_workers_are_the_batches_of_the_training_process(tmp_path, corpus,
                                                                            monkeypatch):
    cache = tmp_path / "cache"
    tokenizer = corpus_tokenizer(_source(corpus), 300, cache)

    def batches(workers: int, resume: tuple[int, int] | None = None) -> list[torch.Tensor]:
        monkeypatch.setenv(LOADER_WORKERS_ENV, str(workers))
        dm = data_module("local-en-de", tokenizer, batch_tokens=600, data_dir=corpus,
                             cache_dir=cache)
        dm.setup()
        loader = dm.train_dataloader()
        assert loader.num_workers == workers
        if resume is not None:
            loader.dataset.resume(*resume)
        first, second = list(loader), list(loader)  # two epochs, each its own shuffle
        return [b["src"] for b in first + second]

    plain = batches(0)
    assert len(plain) > 6
    workers = batches(3)
    assert len(workers) == len(plain)
    assert all(torch.equal(a, b) for a, b in zip(plain, workers, strict=True))
    skipped = batches(2, resume=(0, 5))  # a run resumed after 5 batches of epoch 0
    assert all(torch.equal(a, b) for a, b in zip(plain[5:], skipped, strict=True))
    monkeypatch.setenv(LOADER_WORKERS_ENV, "many")
    dm = data_module("local-en-de", tokenizer, batch_tokens=600, data_dir=corpus)
    with pytest.raises(DataError, match="REPRODUCE_LOADER_WORKERS='many'"):
        _ = dm.loader_workers


def test_batches_read_from_the_cache_equal_the_in_memory_ones_and_map_no_token_file(tmp_path,
                                                                                    corpus):
    cache = tmp_path / "cache"
    tokenizer = corpus_tokenizer(_source(corpus), 300, cache)
    modules = {}
    for name, folder in (("memory", None), ("cache", cache)):
        modules[name] = data_module("local-en-de", tokenizer, batch_tokens=600, data_dir=corpus,
                                    cache_dir=folder)
        modules[name].setup()
    assert modules["memory"].cache_folder is None and modules["cache"].cache_folder is not None
    in_memory, cached = (list(modules[name].train_dataloader()) for name in ("memory", "cache"))
    assert len(cached) == len(in_memory) > 6
    for a, b in zip(in_memory, cached, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # The n-gram references read the targets in long contiguous runs: the same counts.
    assert (modules["cache"].reference_perplexities()
            == modules["memory"].reference_perplexities())
    maps = Path("/proc/self/smaps").read_text()
    folder = str(modules["cache"].cache_folder)
    assert f"{folder}/train.src.lengths.npy" in maps  # the lengths are mapped, and seen here
    assert ".tokens.npy" not in maps  # the token ids never are: no page of them counts as ours


def test_a_token_file_reads_any_sequences_and_refuses_what_its_file_does_not_hold(tmp_path):
    ids = np.arange(100, dtype=np.int32) * 7
    np.save(tmp_path / "t.npy", ids)
    tokens = TokenFile(tmp_path / "t.npy")
    starts, lengths = np.array([10, 13, 0, 50, 50, 99]), np.array([3, 4, 2, 0, 5, 1])
    expected = np.concatenate([ids[s:s + n] for s, n in zip(starts, lengths, strict=True)])
    assert np.array_equal(tokens.gather(starts, lengths), expected)  # 10-13 and 13-17: one read
    assert len(tokens.gather(np.array([5]), np.array([0]))) == 0
    with pytest.raises(IndexError, match="outside"):
        tokens.gather(np.array([98]), np.array([3]))
    with open(tmp_path / "t.npy", "r+b") as f:
        f.truncate((tmp_path / "t.npy").stat().st_size - 4)
    with pytest.raises(ValueError, match="t.npy: .* bytes, not"):
        TokenFile(tmp_path / "t.npy")


def test_the_cache_is_listed_and_pruned_but_never_under_a_build(tmp_path, corpus):
    from reproduce.util.cache_folders import cache_entries, prune
    from reproduce.util.files import exclusive

    cache = tmp_path / "cache"
    tokenizer = corpus_tokenizer(_source(corpus), 300, cache)
    kept = encoded_corpus(_source(corpus), tokenizer, cache_dir=cache)
    other = encoded_corpus(_source(corpus), tokenizer, max_train_pairs=50, cache_dir=cache)
    entries = cache_entries(cache)
    assert {e.folder for e in entries} == {kept.folder, other.folder}
    assert {e.train_pairs for e in entries} == {400, 50} and all(e.bytes > 0 for e in entries)
    assert prune(cache, unused_days=1) == []  # both mapped just now
    with exclusive(cache / "encoded" / f"{kept.folder.name}.lock"):  # a build in progress
        removed = prune(cache)
    assert [e.folder for e in removed] == [other.folder] and not other.folder.exists()
    assert kept.folder.exists()


@pytest.mark.parametrize("every, most", [(1, None), (3, 100)])
def test_the_training_pairs_stream_into_the_arrays_np_save_writes_of_them_whole(
        tmp_path, verses, monkeypatch, every, most):
    """A first run's encoding streams (issue 51): the training text read 37 rows at a time from
    the dataset's Arrow file, the whole split never read into memory, and the arrays written as
    they come are the bytes ``np.save`` writes of the whole split encoded at once; a run
    resumed across the change sees the same batches. Empty pairs dropped, as before."""
    from reproduce.data import source as source_module
    from reproduce.data.batching import Encoded
    from reproduce.data.corpora import pairs_sha256

    with_empty = {**verses, "train": verses["train"][:200] + [("", "leer")]
                  + verses["train"][200:]}
    data_dir = _write_corpus(tmp_path / "corpus", with_empty)
    cache = tmp_path / "cache"
    read: list[str] = []
    load_pairs = source_module.load_pairs

    def spied(corpus, split, *args, **kwargs):
        read.append(split)
        return load_pairs(corpus, split, *args, **kwargs)

    monkeypatch.setattr(source_module, "load_pairs", spied)
    monkeypatch.setattr(source_module, "READ_ROWS", 37)
    tokenizer = corpus_tokenizer(_source(data_dir), 300, cache)
    encode, sizes = tokenizer.encode, []
    monkeypatch.setattr(tokenizer, "encode", lambda texts: sizes.append(len(texts))
                        or encode(texts))
    streamed = encoded_corpus(_source(data_dir), tokenizer, train_every=every,
                              max_train_pairs=most, cache_dir=cache)
    assert "train" not in read and read.count("dev") == 1  # the training text never held whole
    assert max(sizes[:-2]) <= 37 and len(sizes) >= 2 * 3  # batches of 37 rows read, or fewer
    train = [(s, t) for s, t in with_empty["train"] if s and t][::every][:most]
    assert len(streamed.train) == len(train) and streamed.sha256["train"] == pairs_sha256(train)
    whole = Encoded.encode(tokenizer, train)
    for side in ("src", "tgt"):
        for part in ("tokens", "starts", "lengths"):
            buffer = io.BytesIO()
            np.save(buffer, getattr(getattr(whole, side), part))
            written = (streamed.folder / f"train.{side}.{part}.npy").read_bytes()
            assert written == buffer.getvalue(), (side, part)


def test_an_encode_that_fails_midway_leaves_no_cache_and_no_temporary_folder(tmp_path, corpus,
                                                                             monkeypatch):
    from reproduce.data import source as source_module

    monkeypatch.setattr(source_module, "READ_ROWS", 50)
    cache = tmp_path / "cache"
    tokenizer = corpus_tokenizer(_source(corpus), 300, cache)
    encode, calls = tokenizer.encode, []

    def fails_on_the_fifth_batch(texts):
        calls.append(len(texts))
        if len(calls) == 5:
            raise OSError(28, "No space left on device")
        return encode(texts)

    monkeypatch.setattr(tokenizer, "encode", fails_on_the_fifth_batch)
    with pytest.raises(OSError, match="No space left"):
        encoded_corpus(_source(corpus), tokenizer, cache_dir=cache)
    assert [p.name for p in (cache / "encoded").iterdir() if p.is_dir()] == []
    monkeypatch.setattr(tokenizer, "encode", encode)
    assert len(encoded_corpus(_source(corpus), tokenizer, cache_dir=cache).train) == 400


def test_the_bibles_fingerprint_is_kept_per_database_file_and_read_again_when_it_changes(
        tmp_path, monkeypatch):
    """Hashing every verse costs each run a second or two: the fingerprint is kept beside the
    caches it names, for the same database file; an edited file (or an unreadable memo) is read
    and hashed again."""
    import sqlite3

    from reproduce.data.bible import BIBLE_DB_ENV, extract_bible_db

    db = tmp_path / "bible.db"
    extract_bible_db(db, ("4", "e"))  # bible-en-de's two versions
    monkeypatch.setenv(BIBLE_DB_ENV, str(db))
    monkeypatch.setenv("REPRODUCE_CACHE", str(tmp_path / "cache"))
    first = CorpusSource("bible-en-de")
    fingerprint = first.fingerprint
    assert first._pairs and first._bible_memo().is_file()  # read and hashed, then kept
    again = CorpusSource("bible-en-de")
    assert again.fingerprint == fingerprint and not again._pairs  # nothing read
    with sqlite3.connect(db) as connection:  # Ruth 1:1 in English, said otherwise
        connection.execute("UPDATE bible SET vText = 'Once upon a time.' "
                           "WHERE bbName = 'e' AND bNumber = 8 AND cNumber = 1 AND vNumber = 1")
    edited = CorpusSource("bible-en-de")
    assert edited.fingerprint != fingerprint and edited._pairs
    memo = edited._bible_memo()
    memo.write_text("{\"fingerprint\": \"not one\"")  # damaged: read the verses again
    damaged = CorpusSource("bible-en-de")
    assert damaged.fingerprint == edited.fingerprint and damaged._pairs
