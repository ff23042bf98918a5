"""Parts of one's own (``reproduce/paper/slots.py``): a module named by a spec registers a part
under a name, which is then an ordinary config value. Whatever is wrong with such a module is one
line naming its file, before anything trains; a changed module is a changed config."""

import dataclasses

import pytest

from reproduce.__main__ import main
from reproduce.config import ModelConfig
from reproduce.errors import ConfigError
from reproduce.paper import slots

PART = '''
from torch import nn
from reproduce.paper.slots import register

@register("feed_forward", "{name}")
def make(config):
    return {body}
'''


def _module(folder, file: str, name: str, body: str = "nn.Linear(config.d_model, config.d_model)"):
    path = folder / file
    path.write_text(PART.format(name=name, body=body))
    return path


def _dry_run(tmp_path, capsys, modules: str, part: str) -> tuple[int, list[str]]:
    spec = tmp_path / "mine.yaml"
    spec.write_text(f"variants: {{base: {{}}, own: {{set: {{modules: '{modules}', "
                    f"feed_forward: {part}}}}}}}\n")
    code = main(["table3", "--spec", str(spec), "--scale", "smoke", "--dry-run",
                 "--results", str(tmp_path / "mine")])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.fixture(autouse=True)
def _own_results(monkeypatch, tmp_path):
    for name in ("REPRODUCE_RESULTS", "REPRODUCE_RUNS"):  # --results sets them: undone after
        monkeypatch.setenv(name, str(tmp_path / name))


def test_a_part_of_ones_own_is_planned_with_its_file_pinned(tmp_path, capsys):
    path = _module(tmp_path, "plain.py", "plain-test")
    code, err = _dry_run(tmp_path, capsys, str(path), "plain-test")
    assert code == 0, err
    pinned = slots.resolve_modules(str(path))
    assert pinned == f"{path}#{slots.sha256(path)[:slots.HASHED]}"
    config = dataclasses.replace(ModelConfig(d_model=8, d_ff=16), modules=pinned,
                                 feed_forward="plain-test")
    slots.check_parts(config)
    path.write_text(path.read_text() + "# edited\n")  # the run's code changed: another config
    assert slots.resolve_modules(str(path)) != pinned


@pytest.mark.parametrize("case", ["missing", "import", "twice", "unknown", "shape"])
def test_a_broken_module_is_one_line_naming_its_file_before_anything_runs(tmp_path, capsys, case):
    path, part = tmp_path / f"{case}.py", f"{case}-test"
    if case == "missing":
        said = f"{path}: no such file (model.modules)"
    elif case == "import":
        path.write_text("import not_a_module_anywhere\n")
        said = f"{path}: failed to import: ModuleNotFoundError: "
    elif case == "twice":
        first = _module(tmp_path, "first.py", part)
        _module(tmp_path, f"{case}.py", part)
        code, err = _dry_run(tmp_path, capsys, f"{first},{path}", part)
        assert code == 2 and len(err) == 1 and f"{path}: register(" in err[0], err
        assert f"'{part}' is registered twice (by {first} and {path})" in err[0]
        return
    elif case == "unknown":
        _module(tmp_path, f"{case}.py", "some-other-name")
        said = f"model.feed_forward = '{part}': allowed values are relu"
    else:
        _module(tmp_path, f"{case}.py", part, "nn.Linear(config.d_model, 3)")
        said = f"{path}: model.feed_forward '{part}' maps a (1, 2, 32) input to (1, 2, 3)"
    code, err = _dry_run(tmp_path, capsys, str(path), part)
    assert code == 2 and len(err) == 1 and said in err[0], err
    assert err[0].startswith("error: mine.yaml: variants.own.set: ") or case == "shape"


def test_a_part_no_one_registered_is_refused_where_the_spec_is_read(tmp_path):
    from reproduce.errors import SpecError
    from reproduce.records.sweep import load_spec

    spec = tmp_path / "mine.yaml"
    spec.write_text("variants: {base: {}, E: {set: {positions: rotary}}}\n")
    with pytest.raises(SpecError, match="mine.yaml: variants.E.set: model.positions = 'rotary': "
                       "allowed values are sinusoidal, learned"):
        load_spec(str(spec))


def test_a_module_changed_after_its_run_was_planned_is_refused(tmp_path):
    path = _module(tmp_path, "later.py", "later-test")
    pinned = slots.resolve_modules(str(path))
    path.write_text(path.read_text() + "# edited before it was loaded\n")
    with pytest.raises(ConfigError, match="changed since its run was planned"):
        slots.load_modules(pinned)


def test_the_flops_of_a_part_the_formulas_do_not_know_are_counted_and_said_so():
    """GEGLU (sweeps/examples/glu_feed_forward.py) has three d_model x d_ff matrices where
    equation 2 has two: torch's FlopCounterMode counts 1.5x, and the count says how it was made."""
    from pathlib import Path

    from reproduce.paper import flops

    module = Path(__file__).resolve().parents[2] / "sweeps/examples/glu_feed_forward.py"
    relu = ModelConfig(d_model=32, d_ff=128)
    geglu = dataclasses.replace(relu, modules=slots.resolve_modules(str(module)),
                                feed_forward="geglu")
    slots.check_parts(geglu)
    assert flops.feed_forward_macs(relu) == 2 * 32 * 128 and flops.counted_how(relu) == ""
    assert flops.feed_forward_macs(geglu) == 1.5 * flops.feed_forward_macs(relu)
    assert "'geglu' counted by torch's FlopCounterMode: 12,288" in flops.counted_how(geglu)


def test_positions_of_ones_own_are_checked_for_their_shape(tmp_path):
    path = tmp_path / "positions.py"
    path.write_text('''
import torch
from torch import nn
from reproduce.paper.slots import register

class Flat(nn.Module):
    def forward(self, length, offset=0):
        return torch.zeros(length)

@register("positions", "flat-test")
def flat(config):
    return Flat()
''')
    config = dataclasses.replace(ModelConfig(d_model=8, d_ff=16),
                                 modules=slots.resolve_modules(str(path)), positions="flat-test")
    with pytest.raises(ConfigError, match=rf"{path}: model.positions 'flat-test' gives \(2,\) for "
                       r"2 positions; it must give \(2, 8\)"):
        slots.check_parts(config)
