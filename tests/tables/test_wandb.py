"""W&B as a researcher opens it, read back from what W&B wrote offline (``helpers.wandb_runs``,
W&B's own record messages): one W&B run per record, ``publish`` completing it with the
comparison the tables make and never adding a second, publishing twice changing nothing, the
runs of superseded records tagged, and a training's run in ``WANDB_DIR`` under an id that a
redone run does not share."""

import json
from dataclasses import replace

import pytest

from reproduce.__main__ import main
from reproduce.records.store import write_record
from reproduce.records.sweep import load_spec
from reproduce.tables.dashboard import record_wandb_id
from reproduce.tables.wandb_fields import markdown_tables
from tests.helpers import wandb_runs
from tests.tables.test_results import record


@pytest.fixture
def results(tmp_path, monkeypatch):
    """Table 3 records at `cpu`: base and A1 with two seeds each (a verdict), A1's seed 0 trained
    with W&B (its run holds the curve), and a superseded record of A2 that W&B had logged."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("REPRODUCE_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("REPRODUCE_RUNS", str(tmp_path / "runs"))
    folder = tmp_path / "results" / "table3"
    recs = [record("base", "cpu", 0, ppl=7.0, bleu=3.0), record("base", "cpu", 1, ppl=7.2, bleu=3.1),
            record("A1", "cpu", 0, ppl=8.0, bleu=2.0), record("A1", "cpu", 1, ppl=8.3, bleu=2.1)]
    for r in recs:
        r.update(row="base" if r["variant"] == "base" else "A",
                 curve={"train_loss": [[50, 10.0, 6.1], [100, 20.0, 5.2]], "dev_ppl": [[100, 20.0, 8.0]]},
                 wandb={"id": None, "mode": "disabled"})
    recs[2]["wandb"] = {"id": "table3-A1-cpu-seed0-0123456789", "mode": "offline"}
    for r in recs:
        write_record(folder / f"{r['run_id']}.json", r)
    old = {**record("A2", "cpu", 0), "row": "A", "wandb": {"id": "table3-A2-old", "mode": "offline"}}
    write_record(folder / "superseded" / "table3-A2-cpu-seed0.20261201T000000.json", old)
    # a record redone under the old scheme (the W&B id was the run id): one W&B run holds both
    merged = {**recs[1], "wandb": {"id": "table3-base-cpu-seed1", "mode": "offline"}}
    write_record(folder / "table3-base-cpu-seed1.json", merged)
    write_record(folder / "superseded" / "table3-base-cpu-seed1.20261201T000000.json", merged)
    return tmp_path, recs


def test_publish_completes_one_run_per_record_with_the_comparison_and_twice_changes_nothing(results):
    root, recs = results
    published = root / "runs" / "table3" / "published"
    assert main(["publish", "--table", "table3", "--scale", "cpu"]) == 0
    runs = wandb_runs(published)
    ledger = json.loads((published / "published.json").read_text())
    by_record = {k: v["id"] for k, v in ledger.items() if k != "__table__"}
    assert by_record["table3-A1-cpu-seed0"] == "table3-A1-cpu-seed0-0123456789"  # its own run
    assert by_record["table3-A2-cpu-seed0@table3-A2-old"] == "table3-A2-old"
    assert len(set(by_record.values())) == len(by_record) == 5
    assert set(runs) == set(by_record.values()) | {ledger["__table__"]["id"]}
    assert "superseded" in runs["table3-A2-old"]["tags"]
    assert not {"superseded"} & runs[by_record["table3-A1-cpu-seed1"]]["tags"]
    assert "superseded" not in runs["table3-base-cpu-seed1"]["tags"]  # the current record's run

    # the comparison the Markdown table makes, as summary fields of each variant's run
    a1 = runs[by_record["table3-A1-cpu-seed1"]]
    s = a1["summary"]
    assert s["compare/PPL/our_change"] == pytest.approx((8.0 + 8.3) / 2 - (7.0 + 7.2) / 2)
    assert s["compare/PPL/paper_change"] == pytest.approx(5.29 - 4.92)
    assert s["compare/PPL/verdict"] in ("yes", "no", "no effect")
    assert s["compare/PPL/dominant"] == "seeds" and s["compare/PPL/sentence_noise"] is None
    assert s["compare/PPL/half_width"] > 0 and s["compare/verdict"].startswith(s["compare/PPL/verdict"])
    assert s["paper/ppl"] == 5.29 and s["final/dev_ppl"] == 8.3
    assert not any(k.startswith("compare/") for k in runs[by_record["table3-base-cpu-seed0"]]["summary"])
    # the curve where the training logged none (every point, in step order); not again where it did
    assert a1["steps"] == [50, 100] and not runs["table3-A1-cpu-seed0-0123456789"]["steps"]
    # the table's run: the Markdown's tables, each with its columns
    table = runs[ledger["__table__"]["id"]]
    md = (root / "results" / "table3.md").read_text()
    for name, _, _ in markdown_tables(md):  # a W&B Table each: its summary is the table file's
        assert table["summary"][f"table3/{name}/_type"] == "table-file"
    name, header, _ = markdown_tables(md)[0]
    files = list((table["folders"][0] / "files").rglob("*.table.json"))
    assert any(json.loads(f.read_text())["columns"] == header for f in files), name

    before = {p: p.read_bytes() for p in published.rglob("*.wandb")}
    assert main(["publish", "--table", "table3", "--scale", "cpu"]) == 0
    assert {p: p.read_bytes() for p in published.rglob("*.wandb")} == before

    recs[3]["metrics"]["dev_ppl"] = 8.6  # a record that changed: its own run again, no new one
    write_record(root / "results" / "table3" / f"{recs[3]['run_id']}.json", recs[3])
    assert main(["publish", "--table", "table3", "--scale", "cpu"]) == 0
    again = wandb_runs(published)
    assert set(again) == set(runs)  # the table's run too is the same, updated
    assert again[by_record["table3-A1-cpu-seed1"]]["summary"]["final/dev_ppl"] == 8.6


def test_a_markdown_table_reads_back_as_its_cells():
    text = "# T\n\n| | a | b |\n|---|---|---|\n| x | 1 |  |\n\n## S\n\n| c |\n|---|\n| 2 |\n"
    assert markdown_tables(text) == [("T", ["column 0", "a", "b"], [["x", "1", ""]]),
                                     ("S", ["c"], [["2"]])]
    assert load_spec("table3").kind == "table3"


def test_committed_records_publish_into_an_empty_offline_folder_once(tmp_path, monkeypatch):
    """Table 2's committed records, each its own W&B run, none twice."""
    from reproduce import paths

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("REPRODUCE_RESULTS", str(paths.REPO / "results"))
    monkeypatch.setenv("REPRODUCE_RUNS", str(tmp_path / "runs"))
    assert main(["publish", "--table", "table2", "--scale", "cpu"]) == 0
    runs = wandb_runs(tmp_path / "runs" / "table2" / "published")
    records = [json.loads(p.read_text()) for p in (paths.REPO / "results" / "table2").glob("*.json")]
    cpu = [r for r in records if r["scale"] == "cpu"]
    ids = [record_wandb_id(r, paths.REPO / "results") for r in cpu]
    assert len(set(ids)) == len(cpu) and set(runs) - set(ids) == {_table_id(runs)}
    spec = load_spec("table2")
    for r, i in zip(cpu, ids, strict=True):
        assert runs[i]["summary"]["paper/bleu"] == spec.variants[r["variant"]].paper["bleu"]
        assert runs[i]["summary"]["final/test_bleu"] == r["metrics"]["test_bleu"]


def _table_id(runs: dict[str, dict]) -> str:
    (table,) = [i for i, run in runs.items() if "table" in run["tags"]]
    return table


def test_a_run_keeps_its_w_b_id_while_it_resumes_and_gets_a_new_one_when_redone(tmp_path):
    from reproduce.train.wandb_run import run_id, wandb_id

    run = load_spec("table3").plan(["base"], "smoke", [0])[0]
    work = tmp_path / "runs" / "table3" / run.run_id
    first, earlier = run_id(run, work)
    assert first.startswith("table3-base-smoke-seed0-") and earlier is None
    assert run_id(run, work)[0] != first  # no checkpoint yet: started again from nothing
    first = run_id(run, work)[0]
    (work / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert run_id(run, work) == (first, None)  # resumed: the same W&B run
    decoded = replace(run, config=run.config.overrides(beam=3))  # evaluated again, not retrained
    again, earlier = run_id(decoded, work)
    assert again != first and earlier == first and run_id(decoded, work) == (again, first)
    (work / "checkpoints").rename(work / "superseded-1")  # retire_stale: redone from the start
    assert run_id(run, work)[0] not in (first, again)
    config = run.config.to_dict()
    assert wandb_id(run.run_id, tmp_path / "a", config) != wandb_id(run.run_id, tmp_path / "b", config)
    changed = {**config, "train": {**config["train"], "warmup_steps": 1}}
    assert wandb_id(run.run_id, tmp_path / "a", config) != wandb_id(run.run_id, tmp_path / "a", changed)
    assert len(wandb_id("x" * 80, tmp_path, config)) == 48 + 11
