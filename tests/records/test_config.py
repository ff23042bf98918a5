"""Configs, presets, sweep specs and the parameter table's CLI."""

import dataclasses
import json
import os

import pytest

from reproduce.config import BASE, BIG, PARSING, Config, ModelConfig, apply_overrides
from reproduce.errors import ConfigError, SpecError
from reproduce.records.sweep import load_spec, shipped_specs
from tests.helpers import cli
from tests.paper.test_model import independent_count


@pytest.mark.parametrize("overrides, message", [
    ({"d_model": 0}, "model.d_model = 0: must be a positive integer"),
    ({"h": -1}, "model.h = -1"),
    ({"p_drop": 1.0}, r"model.p_drop = 1.0: must be in \[0, 1\)"),
    ({"init": "orthogonal"}, "model.init = 'orthogonal': allowed values are xavier, depth-scaled"),
    ({"d_model": 511, "positions": "sinusoidal"}, "even d_model"),
    ({"eps_ls": -0.1}, "train.eps_ls"),
    ({"precision": "fp8"}, "allowed values are auto, 32-true"),
    ({"beam": 0}, "decode.beam"),
    ({"hh": 3}, "unknown config key 'hh'; allowed keys: .*d_model"),
    ({"h": "8"}, "h = '8': expected int, got str"),
    ({"model.eps_ls": 0.1}, "unknown config key 'model.eps_ls'"),
])
def test_impossible_configs_fail_with_one_clear_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as e:
        apply_overrides(BASE, overrides)
    assert "\n" not in str(e.value)


def test_odd_d_model_is_fine_with_learned_positions():
    assert BASE.overrides(d_model=511, positions="learned").model.d_model == 511


def test_presets_are_the_papers():
    assert (BASE.model.N, BASE.model.d_model, BASE.model.d_ff, BASE.model.h) == (6, 512, 2048, 8)
    assert (BASE.model.p_drop, BASE.train.eps_ls, BASE.train.warmup_steps) == (0.1, 0.1, 4000)
    assert (BIG.model.d_model, BIG.model.d_ff, BIG.model.h, BIG.model.p_drop) == (1024, 4096, 16, 0.3)
    assert BIG.train.train_steps == 300_000
    assert (PARSING.model.N, PARSING.model.d_model) == (4, 1024)
    assert (PARSING.decode.beam, PARSING.decode.alpha, PARSING.decode.max_len_offset) == (21, 0.3, 300)
    assert (BASE.decode.beam, BASE.decode.alpha, BASE.decode.max_len_offset) == (4, 0.6, 50)


def test_config_dict_round_trip():
    c = BIG.overrides(seed=3, corpus="bible-en-fr")
    assert Config.from_dict(json.loads(json.dumps(c.to_dict()))) == c


@pytest.mark.parametrize("path", shipped_specs(), ids=lambda p: p.name)
def test_every_shipped_spec_loads(path):
    spec = load_spec(path)
    assert spec.variants
    for scale in spec.scales:
        for name in spec.variants:
            spec.resolve(name, scale)


def test_table3_spec_is_the_papers_table():
    spec = load_spec("table3")
    assert spec.select(rows=["A"]) == ["base", "A1", "A2", "A3", "A4"]
    assert len(spec.variants) == 20
    assert spec.resolve("big", "paper").model == BIG.model.__class__(
        **{**BIG.model.__dict__, "vocab_size": 37000})
    assert spec.resolve("big", "paper").train.train_steps == 300_000
    b1 = spec.resolve("B1", "paper").model
    assert (b1.d_k, b1.d_v) == (16, 64)


def test_scales_keep_each_rows_ratios_to_base():
    spec = load_spec("table3")
    for scale in ("cpu", "smoke"):
        base = spec.resolve("base", scale)
        for name in spec.variants:
            v, paper_v = spec.resolve(name, scale), spec.resolve(name, "paper")
            for f in ("d_model", "d_ff", "d_k", "d_v"):
                ratio = getattr(paper_v.model, f) / getattr(BASE.model, f)
                assert getattr(v.model, f) == max(1, round(getattr(base.model, f) * ratio)), f
            assert (v.model.h, v.model.N, v.model.p_drop, v.train.eps_ls, v.model.positions) == (
                paper_v.model.h, paper_v.model.N, paper_v.model.p_drop, paper_v.train.eps_ls,
                paper_v.model.positions)
            steps_ratio = paper_v.train.train_steps / spec.resolve("base", "paper").train.train_steps
            assert v.train.train_steps == round(base.train.train_steps * steps_ratio)


def _write(tmp_path, text):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, message", [
    ("variants: {base: {set: {hh: 1}}}", r"bad.yaml: variants.base.set: unknown config key 'hh'"),
    ("variants: {base: {sett: {}}}",
     r"bad.yaml: variants.base: unknown key\(s\) sett; allowed: paper, question, set"),
    ("variants: {base: {question: {asks: why, against: base, settled_if: so}}}",
     r"variants.base.question: needs asks \(text\), against \(a list"),
    ("variants: {base: {question: {asks: why, agianst: [base]}}}",
     r"variants.base.question: unknown key\(s\) agianst; allowed: against, asks, settled_if"),
    ("variants: {base: {set: {h: one}}}", r"variants.base.set: h = 'one': expected int"),
    ("tabel: x\nvariants: {base: {}}", r"bad.yaml: unknown key\(s\) tabel"),
    ("variants: {}", "lists no variants"),
    ("variants: {base: {}}\nrows: {A: [A9]}", r"rows.A: unknown variant 'A9'; valid variants: base"),
    ("variants: {base: {}}\nscales: {tiny: {set: {d_ff: 4}}}", r"scales.tiny.set: d_ff"),
    ("variants: {base: {set: {h: 2}}}\nscales: {tiny: {width: 2}}", r"scales.tiny.width = 2"),
    ("variants: [", "not valid YAML"),
    ("variants: {base: {}, A1: {set: {h: 2}}}\nrows: {A: [A1]}\nscales: {probe: {rows: [B]}}",
     r"bad.yaml: scales.probe.rows: unknown row 'B'; valid rows: A"),
    ("variants: {base: {}, A1: {set: {h: 2}}}\nrows: {A: [A1]}\nscales: {probe: {rows: A}}",
     r"bad.yaml: scales.probe.rows = 'A': expected a list of row names"),
])
def test_bad_specs_fail_with_the_right_message(tmp_path, text, message):
    with pytest.raises(SpecError, match=message):
        load_spec(_write(tmp_path, text))


def test_a_variant_wins_over_what_the_spec_s_own_scale_sets(tmp_path):
    spec = load_spec(_write(tmp_path, "variants: {base: {}, A: {set: {h: 2}}}\n"
                                      "scales: {tiny: {set: {h: 4}, width: 0.5}}"))
    assert spec.resolve("A", "tiny").model.h == 2 and spec.resolve("base", "tiny").model.h == 4
    assert "A sets h 2 (the scale's 4)" in spec.over_scale_line("tiny")


def test_unknown_row_lists_valid_rows():
    with pytest.raises(SpecError, match="unknown row 'Z'; valid rows: A, B, C, D, E, big"):
        load_spec("table3").select(rows=["Z"])


def test_a_scale_that_names_its_rows_plans_only_them():
    # cpu-wide is table3's probe of row A: base and A1-A4 by default, any other row an error
    # naming the file, the field and the rows it allows
    spec = load_spec("table3")
    assert spec.select(scale="cpu-wide") == ["base", "A1", "A2", "A3", "A4"]
    assert spec.variants_at("cpu-wide") == ["base", "A1", "A2", "A3", "A4"]
    assert spec.select(rows=["A"], variants=["base"], scale="cpu-wide")[0] == "base"
    assert list(spec.rows_at("cpu-wide")) == ["A"] and spec.rows_at("cpu") == spec.rows
    assert spec.variants_at("cpu") == list(spec.variants)
    for rows, variants, what in ((["C"], None, "row C"), (None, ["D1"], r"variant D1 \(row D\)")):
        with pytest.raises(SpecError, match=r"table3.yaml: scales.cpu-wide runs A: base, A1, "
                                            r"A2, A3, A4: " + what + " is not run at scale "
                                            "`cpu-wide`"):
            spec.select(rows, variants, scale="cpu-wide")
    assert "C1" in spec.select(rows=["C"], scale="cpu")


def test_a_probe_that_names_its_variants_plans_reports_and_renders_only_them(tmp_path):
    # cpu-long and the data probes are base against A1: status must not count A2-A4 as missing
    spec = load_spec("table3")
    for scale in ("cpu-long", "cpu-half-data", "cpu-quarter-data"):
        assert spec.rows_at(scale) == {"A": ["A1"]}
        assert spec.variants_at(scale) == ["base", "A1"] == spec.select(rows=["A"], scale=scale)
        with pytest.raises(SpecError, match=rf"scales.{scale} runs A: base, A1: variant A2 "
                                            rf"\(row A\) is not run at scale `{scale}`"):
            spec.select(variants=["A2"], scale=scale)
    from reproduce.records.sweep import load_scales
    rows = {"A": ["A1", "A2"], "B": ["B1"]}
    for raw, message in (({"rows": ["A"], "variants": ["B1"]},
                          r"scales.p.variants: 'B1' is not a variant of its rows \(A\); valid: A1, "
                          "A2"),
                         ({"variants": ["A1"]}, r"scales.p.variants: name the scale's rows first"),
                         ({"rows": ["A"], "variants": "A1"}, r"scales.p.variants = 'A1': expected "
                                                             "a list")):
        with pytest.raises(SpecError, match=r"table9.yaml: " + message):
            load_scales(tmp_path / "table9.yaml", {"p": raw}, set(), rows)


def test_cpu_long_is_cpu_trained_twice_as_long():
    # the probe of row A's schedule: every setting of `cpu` but the steps (and lrate
    # depends on the step and warm-up, not on the run's length)
    spec = load_spec("table3")
    for name in spec.variants_at("cpu-long"):
        cpu, long = spec.resolve(name, "cpu"), spec.resolve(name, "cpu-long")
        assert long.train.train_steps == 2 * cpu.train.train_steps == 5000
        assert long.overrides(train_steps=cpu.train.train_steps) == cpu


def test_the_data_size_probes_are_cpu_on_fewer_training_pairs():
    spec = load_spec("table3")
    for scale, every in (("cpu-half-data", 2), ("cpu-quarter-data", 4)):
        assert list(spec.rows_at(scale)) == ["A"]
        for name in spec.variants_at(scale):
            cpu, fewer = spec.resolve(name, "cpu"), spec.resolve(name, scale)
            assert fewer.data.train_every == every and cpu.data.train_every == 1
            assert fewer.overrides(train_every=1) == cpu
    with pytest.raises(ConfigError, match=r"data.train_every = 0: must be >= 1"):
        spec.resolve("base", "cpu").overrides(train_every=0)


def test_the_follow_ups_are_table3_s_runs_and_say_what_settles_them():
    """sweeps/table3-followups.yaml: its base is Table 3's at `cpu` and, at cpu-quarter-data (the
    scale declared in both specs), Table 3's there; its variants are Table 3's base but for what
    each sets; each names what it is read against and what settles it."""
    ours, table3 = load_spec("table3-followups"), load_spec("table3")
    for scale in ("cpu", "cpu-quarter-data"):
        assert ours.resolve("base", scale) == table3.resolve("base", scale)
    assert ours.resolve("D1", "cpu-quarter-data") == table3.resolve("D1", "cpu").overrides(
        train_every=4)
    assert list(ours.rows_at("cpu-quarter-data")) == ["D"]
    # its `cpu` is the shared one but that row D runs at cpu-quarter-data only: neither status
    # nor a sweep without --row counts or trains D at `cpu`
    assert list(ours.rows_at("cpu")) == ["width", "E"]
    assert dataclasses.replace(ours.scale("cpu"), rows=()) == table3.scale("cpu")  # narrowed
    with pytest.raises(SpecError, match=r"variant D1 \(row D\) is not run at scale `cpu`"):
        ours.select(variants=["D1"], scale="cpu")
    wide = ours.resolve("W8", "cpu").model
    assert (wide.h, wide.d_k, wide.d_v) == (8, 64, 64)  # 4x base's 16 at cpu
    assert ours.resolve("E-sin", "cpu").model.positions_init == "sinusoid"
    for name, variant in ours.variants.items():
        assert variant.question["asks"] and variant.question["settled_if"], name
        assert all(other in ours.variants or other.startswith("table3/")
                   for other in variant.question["against"]), name


def test_a_spec_s_scale_of_a_shared_name_setting_only_rows_narrows_it(tmp_path):
    """`cpu: {rows: [A]}` in a user's spec is scales.yaml's `cpu` running row A (not a scale of
    width 1 and no settings that calls itself cpu); one setting anything else replaces it."""
    text = "variants: {base: {}, A1: {set: {h: 2}}, B1: {set: {N: 1}}}\nrows: {A: [A1], B: [B1]}\n"
    narrowed = load_spec(_write(tmp_path, text + "scales: {cpu: {rows: [A], variants: [A1]}}"))
    shared = load_spec(_write(tmp_path, text))
    assert narrowed.scale("cpu") == dataclasses.replace(shared.scale("cpu"), rows=("A",),
                                                        variants=("A1",))
    assert narrowed.resolve("A1", "cpu") == shared.resolve("A1", "cpu")
    assert narrowed.select(scale="cpu") == ["base", "A1"]
    replaced = load_spec(_write(tmp_path, text + "scales: {cpu: {rows: [A], width: 0.5}}"))
    assert (replaced.scale("cpu").width, replaced.scale("cpu").overrides) == (0.5, {})
    with pytest.raises(SpecError, match=r"bad.yaml: scales.cpu.rows: unknown row 'C'"):
        load_spec(_write(tmp_path, text + "scales: {cpu: {rows: [C]}}"))


def test_a_shared_scale_may_not_name_rows(tmp_path):
    from reproduce.records.sweep import load_scales
    with pytest.raises(SpecError, match=r"scales.yaml: scales.tiny.rows: a shared scale is every "
                                        "table's"):
        load_scales(tmp_path / "scales.yaml", {"tiny": {"rows": ["A"]}}, set())


def test_params_cli_lists_all_variants_with_exact_counts():
    out = cli(dict(os.environ), "table3", "--params", "--json", "--vocab-size", "41000")
    rows = json.loads(out.stdout)
    spec = load_spec("table3")
    assert [r["variant"] for r in rows] == list(spec.variants)
    for r in rows:
        expected = independent_count(spec.resolve(r["variant"], "paper").model.__class__(
            **{**spec.resolve(r["variant"], "paper").model.__dict__, "vocab_size": 41000}))
        assert r["params"] == expected
        if r["paper_params_m"] is not None:  # the paper's column fits a ~41000 tied vocabulary
            assert abs(r["params"] / 1e6 - r["paper_params_m"]) <= 0.03 * r["paper_params_m"]


def test_params_cli_states_the_vocabulary():
    out = cli(dict(os.environ), "table3", "--params").stdout
    assert "shared vocabulary 37000" in out and "41000" in out


def test_model_config_is_immutable():
    with pytest.raises(AttributeError):
        ModelConfig().d_model = 3
