"""One model identity (issue 83, item 1): what tells two models apart is derived from
``ModelConfig``'s own fields (their declared kind), so a knob added to the config is told apart
by every place that keys, plans, counts or reports a model, without a second list to edit."""

import dataclasses
import json

import pytest

from reproduce.config import Config, ModelConfig, model_identity
from reproduce.records.sweep import load_spec, planned_summary
from reproduce.speed.report import scale_heading
from reproduce.tables.params import shape_row
from reproduce.train import micro_batch, timings


@dataclasses.dataclass(frozen=True)
class WithKnob(ModelConfig):
    """A copy of the config with a throwaway knob that declares no kind (so: a shape)."""

    knob: int = 0


def _pair() -> tuple[Config, Config]:
    base = Config(model=WithKnob(vocab_size=500, N=2, d_model=32, d_ff=64, h=4, d_k=8, d_v=8))
    return base, dataclasses.replace(base, model=dataclasses.replace(base.model, knob=1))


def test_every_place_that_tells_models_apart_tells_a_new_knob_apart():
    base, other = _pair()
    assert model_identity(base.model) != model_identity(other.model)
    # the timing caches of the three `auto` choosers (precision, compile, micro-batch)
    for kinds in (("shape",), ("shape", "dropout")):
        assert timings.shape_key(base, 512, kinds) != timings.shape_key(other, 512, kinds)
    # the plan's line
    run = load_spec("table3").plan(["base"], "smoke", [0])[0]
    lines = [planned_summary(dataclasses.replace(run, config=c), {}) for c in (base, other)]
    assert lines[0] != lines[1] and "knob=1" in lines[1]
    # the parameter column's row, and a speed report's heading
    assert shape_row(base.model)["knob"] == 0 and shape_row(other.model)["knob"] == 1
    heads = [scale_heading("x", c) for c in (base, other)]
    assert heads[0] != heads[1] and "knob=1" in heads[1]
    # the micro-batch cache's key
    keys = [micro_batch.cache_key(c, 512, "32-true", "given") for c in (base, other)]
    assert keys[0] != keys[1]


def test_what_only_starts_the_weights_is_not_a_shape():
    base = ModelConfig()
    for change in ({"init": "depth-scaled"}, {"pad_id": 1}):
        assert model_identity(dataclasses.replace(base, **change)) == model_identity(base)
    assert model_identity(dataclasses.replace(base, p_drop=0.3)) == model_identity(base)
    assert model_identity(dataclasses.replace(base, p_drop=0.3), ("shape", "dropout")) \
        != model_identity(base, ("shape", "dropout"))


@pytest.mark.parametrize("kind", ["shape", "dropout", "size", "start", "id"])
def test_every_model_field_declares_a_kind(kind):
    declared = {f.name: f.metadata.get("kind") for f in dataclasses.fields(ModelConfig)}
    assert all(declared.values()), declared
    assert kind in declared.values()


def test_the_three_auto_choosers_share_one_cache_keyed_by_the_identity(tmp_path, monkeypatch):
    """precision, compile and the micro-batch follow one protocol (``timings.measured``) into
    one file: each entry named by its chooser and the model's identity, a new knob's value timed
    anew, the same model read back without measuring."""
    from reproduce.train import compiling, precision

    monkeypatch.setattr(precision, "bf16_matmul_not_slower", lambda: True)
    cache = tmp_path / timings.TIMINGS
    measured: list[str] = []

    def choose_all(config: Config) -> list[bool]:
        config = config.overrides(precision="auto", compile="auto", device_batch_tokens="auto")
        _, p = precision.choose(config, 512, cache, timer=lambda c, t: measured.append("p") or {
            "32-true": 1.0, "bf16-mixed": 2.0})
        _, c = compiling.choose(config, 512, 100, "32-true", "cpu", cache,
                                timer=lambda *a: measured.append("c") or {
                                    "eager": 1.0, "compiled": 2.0, "compile_seconds": 1.0})
        _, m = micro_batch.choose(config, 1, "32-true", "gpu", cache, total=2**40,
                                  peak=lambda tokens: measured.append("m") or 2**20)
        return [p["cached"], c["cached"], m["cached"]]

    base, other = _pair()
    assert choose_all(base) == [False] * 3 and measured == ["p", "c", "m"]
    assert choose_all(base) == [True] * 3 and len(measured) == 3  # read back, not measured
    assert choose_all(other) == [False] * 3 and len(measured) == 6  # the knob: timed anew
    keys = sorted(json.loads(cache.read_text()))
    assert [k.split("|")[0] for k in keys] == ["compile"] * 2 + ["micro-batch"] * 2 + \
        ["precision"] * 2
    for config in (base, other):  # the micro-batch's entries also know the dropouts (memory)
        shape, memory = (model_identity(config.model, kinds) for kinds in (
            ("shape",), ("shape", "dropout")))
        assert sum(f"|{shape}-tok" in k for k in keys) == 2
        assert sum(f"|{memory}-tok" in k for k in keys) == 1


def test_the_speed_peers_refuse_a_part_they_do_not_build():
    """nn.Transformer and MarianMT are built as the paper's model: timed beside pre-norm they
    would be another model, so they say so instead."""
    from reproduce.speed.peers import TorchTransformer

    config = ModelConfig(vocab_size=50, N=1, d_model=16, d_ff=32, h=4, d_k=4, d_v=4)
    TorchTransformer(config)
    with pytest.raises(ValueError, match="builds the paper's parts .*; got wiring pre-norm"):
        TorchTransformer(dataclasses.replace(config, wiring="pre-norm"))
