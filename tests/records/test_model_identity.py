"""One model identity (issue 83, item 1): what tells two models apart is derived from
``ModelConfig``'s own fields (their declared kind), so a knob added to the config is told apart
by every place that keys, plans, counts or reports a model, without a second list to edit."""

import dataclasses

import pytest

from reproduce.config import Config, ModelConfig, model_identity
from reproduce.records.sweep import load_spec, planned_summary
from reproduce.speed.report import scale_heading
from reproduce.tables.params import shape_row
from reproduce.train import micro_batch, step_time


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
        assert step_time.shape_key(base, 512, kinds) != step_time.shape_key(other, 512, kinds)
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
