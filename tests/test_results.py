"""Records in, tables out: atomic writes, round trips and rendering."""

import json

from reproduce.results import load_records, render_table3
from reproduce.runner import write_atomic
from reproduce.sweep import load_spec


def record(variant, scale="smoke", seed=0, ppl=9.5, bleu=1.5, params=123456):
    return {"run_id": f"table3-{variant}-{scale}-seed{seed}", "table": "table3", "variant": variant,
            "scale": scale, "seed": seed, "data": {"corpus": "bible-en-de"},
            "metrics": {"dev_ppl": ppl, "dev_bleu": bleu, "test_bleu": bleu + 1, "params": params},
            "bleu": {"dev": {"sacrebleu": {"signature": "nrefs:1|tok:13a"}}},
            "hardware": {"cpu": "test CPU", "gpus": []}}


def test_record_round_trip_is_atomic(tmp_path):
    r = record("A1")
    path = tmp_path / "table3" / "x.json"
    write_atomic(path, r)
    assert load_records("table3", tmp_path) == [r]
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]  # no temp file left behind
    write_atomic(path, {**r, "seed": 1})
    assert json.loads(path.read_text())["seed"] == 1


def _row(table: str, first_cell_after_label: str) -> list[str]:
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) > 2 and cells[4:7] == first_cell_after_label.split(","):
            return cells
    raise AssertionError(f"no row {first_cell_after_label}")


def test_rendering_puts_ours_beside_the_papers():
    spec = load_spec("table3")
    table = render_table3(spec, [record("base", ppl=7.25, bleu=3.0, params=2_500_000),
                                 record("A1", ppl=8.5)])
    base = _row(table, "8,64,64")
    assert base[0] == "base" and base[10:17] == ["4.92", "7.25", "25.8", "3.0", "4.0", "65", "2.50"]
    a1 = _row(table, "1,512,512")
    assert a1[0] == "(A)" and a1[10:13] == ["5.29", "8.50", "24.9"]
    a2 = _row(table, "4,128,128")
    assert a2[11] == "" and a2[13] == ""  # no record: our cells stay empty
    assert "Not comparable with WMT" in table and "nrefs:1|tok:13a" in table


def test_scales_are_never_mixed_and_seeds_are_summarised():
    spec = load_spec("table3")
    table = render_table3(spec, [record("base", "cpu", 0, ppl=6.0), record("base", "cpu", 1, ppl=8.0),
                                 record("base", "smoke", 0, ppl=100.0)])
    cpu, smoke = table.split("## Scale `cpu`")[1].split("## Scale `smoke`")
    assert "7.00 ± 1.41 (n=2)" in cpu and "100.00" not in cpu
    assert "100.00" in smoke and "7.00" not in smoke


def test_no_records_renders_an_empty_table():
    assert "No runs recorded yet." in render_table3(load_spec("table3"), [])
