"""Read and validate ``sweeps/*.yaml``; expand rows x scale x seeds into planned runs.

A spec holds the base config, each variant as overrides of it (only the cells the paper lists) and
the paper's figures beside it. A scale (``sweeps/scales.yaml``) resizes every variant by the same
factors and may only set what no variant varies, so a row means the same thing at every scale.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from reproduce.config import (
    BASE,
    FIELDS,
    PART_SLOTS,
    PRESETS,
    Config,
    apply_overrides,
    model_items,
)
from reproduce.errors import ConfigError, SpecError
from reproduce.paths import SWEEPS

WIDTH_FIELDS = ("d_model", "d_ff", "d_k", "d_v")


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: dict[str, Any]
    paper: dict[str, Any]
    # A follow-up's question (QUESTION_KEYS): what it asks, the runs it is read against and the
    # outcome that settles it, written before it runs; empty for the paper's own variants.
    question: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Knob:
    """One tuned (nuisance) setting: a range (``low``..``high``, on a log scale if ``log``) or a
    list of ``choices``."""

    name: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Tuning:
    """What ``--tune`` searches: the metric to optimise on the dev split and the knobs."""

    metric: str
    direction: str  # maximize | minimize
    knobs: dict[str, Knob]


@dataclass(frozen=True)
class Scale:
    name: str
    about: str
    width: float
    steps: float
    corpus: dict[str, str]
    vocab: dict[str, int]
    overrides: dict[str, Any]
    tune: dict[str, Knob] = field(default_factory=dict)  # replaces the spec's knobs of that name
    # Devices one run trains on unless --devices says otherwise: a number or "auto" (every visible
    # GPU; 1 on a CPU). Where a run trains, not what it is: never part of its config.
    devices: int | str = 1
    # The rows of the table this scale is for (a table's own scale, e.g. a probe of one row);
    # empty: every row. Runs, `status` and the rendered table keep to them.
    rows: tuple[str, ...] = ()
    # Of those rows' variants, the ones it runs beside base (empty: all of them): a probe of
    # base against one variant.
    variants: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlannedRun:
    table: str
    row: str
    variant: str
    scale: str
    seed: int
    config: Config
    paper: dict[str, Any] = field(default_factory=dict)
    tag: str = ""  # tells apart runs of one variant on other data or with tuned settings
    # Settings of the spec's base that the scale replaced: {key: {"spec": v, "scale": v}}.
    overridden: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The model whose timed step decides `precision: auto` on a CPU: the spec's base at this scale,
    # so every variant of a table trains in one precision (None: the run's own config).
    precision_from: Config | None = None
    sets: dict[str, Any] = field(default_factory=dict)  # --set on the command line (with_sets)
    # How `device_batch_tokens: auto` was resolved for this run (train.micro_batch.resolve)
    micro_batch_choice: dict[str, Any] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return f"{self.table}-{self.variant}-{self.scale}-seed{self.seed}" + (
            f"-{self.tag}" if self.tag else "")


@dataclass(frozen=True)
class Spec:
    path: Path
    table: str
    caption: str
    split: str
    base: dict[str, Any]
    variants: dict[str, Variant]
    rows: dict[str, list[str]]
    scales: dict[str, Scale]
    cited: list[dict[str, Any]] = field(default_factory=list)  # other systems' published rows
    preset: str = "base"  # the named config (reproduce.config.PRESETS) that `base` overrides
    tuning: Tuning | None = None  # `tune:` in the spec; None: the table is not tuned
    kind: str = "table3"  # which of the paper's tables it follows (TABLES): its table and figures

    def search_space(self, scale: str) -> Tuning:
        """The spec's tuning with the scale's own knobs (e.g. smaller beams) in place of its."""
        if self.tuning is None:
            raise SpecError(f"{self.path.name}: no `tune:` section; this table is not tuned")
        return Tuning(self.tuning.metric, self.tuning.direction,
                      {**self.tuning.knobs, **self.scale(scale).tune})

    def row_of(self, variant: str) -> str:
        """The row a variant belongs to; base, and a variant in no row, are their own."""
        return next((row for row, names in self.rows.items() if variant in names), variant)

    def rows_at(self, scale: str | None = None) -> dict[str, list[str]]:
        """The rows run at ``scale`` and their variants run there: those its ``rows:`` and
        ``variants:`` name, or every row (also for None and for a scale the spec no longer has,
        whose records still render)."""
        sc = self.scales.get(scale) if scale else None
        kept, only = (sc.rows, sc.variants) if sc else ((), ())
        rows = {row: [n for n in names if not only or n in only]
                for row, names in self.rows.items() if not kept or row in kept}
        return {row: names for row, names in rows.items() if names}  # rows left without any: out

    def variants_at(self, scale: str) -> list[str]:
        """Every variant planned at ``scale``: all of the spec's, or, for a scale that names its
        rows, base and those rows' variants (those it names)."""
        if not self.scale(scale).rows:
            return list(self.variants)
        return self.select(scale=scale)

    def select(self, rows: list[str] | None = None, variants: list[str] | None = None,
               scale: str | None = None) -> list[str]:
        """Variant names for the given rows (each row also runs base) or explicit variants; with
        neither, base and every row's variants (a variant in no row runs only when named; a spec
        without rows, every variant). At a
        scale that names its rows (``rows_at``), a row or variant outside them is an error."""
        kept = self.rows_at(scale)
        in_kept = {name for names in kept.values() for name in names}
        restricted = in_kept != {name for names in self.rows.values() for name in names}
        chosen: list[str] = []
        for row in rows or []:
            if row not in self.rows:
                raise SpecError(f"{self.path.name}: unknown row {row!r}; valid rows: "
                                f"{', '.join(self.rows)}")
            if row not in kept:
                raise SpecError(self._outside(scale, f"row {row}"))
            chosen += (["base"] if "base" in self.variants else []) + kept[row]
        for name in variants or []:
            if name not in self.variants:
                raise SpecError(f"{self.path.name}: unknown variant {name!r}; valid variants: "
                                f"{', '.join(self.variants)}")
            if restricted and name != "base" and name not in in_kept:
                raise SpecError(self._outside(scale, f"variant {name} (row {self.row_of(name)})"))
            chosen.append(name)
        if not rows and not variants:  # a spec without rows runs every variant (docs/specs.md)
            chosen = [name for name in self.variants
                      if name == "base" or name in in_kept or not self.rows]
        return list(dict.fromkeys(chosen))

    def _outside(self, scale: str | None, what: str) -> str:
        runs = "; ".join(f"{row}: base, {', '.join(names)}"
                         for row, names in self.rows_at(scale).items())
        return (f"{self.path.name}: scales.{scale} runs {runs}: {what} is not run at scale "
                f"`{scale}`; choose one of those, another scale, or add it to "
                f"scales.{scale}.rows (and .variants, where the scale names them)")

    def scale(self, name: str) -> Scale:
        if name not in self.scales:
            raise SpecError(f"unknown scale {name!r}; valid scales: {', '.join(self.scales)}")
        return self.scales[name]

    def resolve(self, variant: str | None, scale: str) -> Config:
        """The full config of one variant at one scale (None: the spec's base, no variant)."""
        sc = self.scale(scale)
        config = apply_overrides(apply_overrides(PRESETS[self.preset], self.base),
                                 self.variants[variant].overrides if variant else {})
        m, t = config.model, config.train
        resized: dict[str, Any] = {f: max(1, round(getattr(m, f) * sc.width)) for f in WIDTH_FIELDS}
        resized["train_steps"] = max(1, round(t.train_steps * sc.steps))
        corpus = sc.corpus.get(config.data.corpus, config.data.corpus)
        config = apply_overrides(config, {**resized, **sc.overrides, "corpus": corpus})
        if corpus in sc.vocab:  # e.g. the paper's 37000 for EN-DE, 32000 for EN-FR
            config = config.overrides(vocab_size=sc.vocab[corpus])
        return apply_overrides(config, self.variant_overrides(scale).get(variant or "", {}))

    def variant_overrides(self, scale: str) -> dict[str, dict[str, Any]]:
        """What each variant sets over the value ``scale`` sets for every run (a warm-up row of
        one's own at `cpu`, whose scale sets warm-up): ``{variant: {key: value}}``; the variant's
        value wins, and the plan says so (``over_scale_line``)."""
        sets = {k.split(".", 1)[-1] for k in self.scale(scale).overrides}
        out = {name: {k: v for k, v in variant.overrides.items() if k.split(".", 1)[-1] in sets}
               for name, variant in self.variants.items()}
        return {name: keys for name, keys in out.items() if keys}

    def over_scale_line(self, scale: str) -> str:
        """The plan's line for ``variant_overrides`` ("" where no variant sets what the scale
        does)."""
        over = self.variant_overrides(scale)
        if not over:
            return ""
        sc = {k.split(".", 1)[-1]: v for k, v in self.scale(scale).overrides.items()}
        return (f"  over scale `{scale}`, whose value every other run takes: " + "; ".join(
            f"{name} sets " + ", ".join(f"{k.split('.', 1)[-1]} {v} (the scale's "
                                        f"{sc[k.split('.', 1)[-1]]})" for k, v in keys.items())
            for name, keys in over.items()))

    def scale_overrides(self, scale: str) -> dict[str, dict[str, Any]]:
        """What ``scale`` sets over a different value the spec's ``base`` gave:
        ``{key: {"spec": value, "scale": value}}`` (the scale wins; the plan and record say so)."""
        sc = self.scale(scale)
        base = {k.split(".", 1)[-1]: v for k, v in self.base.items()}
        sets = dict(sc.overrides)
        corpus = apply_overrides(PRESETS[self.preset], self.base).data.corpus
        if sc.corpus.get(corpus, corpus) in sc.vocab:
            sets["vocab_size"] = sc.vocab[sc.corpus.get(corpus, corpus)]
        out = {}
        for key in sorted(set(base) & set(sets)):
            section = FIELDS[key][0]
            ours, scales = (getattr(getattr(apply_overrides(PRESETS[self.preset], {key: v}),
                                            section), key) for v in (base[key], sets[key]))
            if ours != scales:
                out[key] = {"spec": ours, "scale": scales}
        return out

    def plan(self, variants: list[str], scale: str, seeds: list[int]) -> list[PlannedRun]:
        overridden = self.scale_overrides(scale)
        reference = self.resolve(None, scale)
        return [
            PlannedRun(self.table, self.row_of(v), v, scale, seed,
                       with_modules(self.resolve(v, scale).overrides(seed=seed)),
                       self.variants[v].paper, overridden=overridden, precision_from=reference)
            for v in variants for seed in seeds
        ]


SPEC_KEYS = {"table", "kind", "caption", "split", "base", "variants", "rows", "scales", "cited",
             "preset", "tune"}
# The paper's tables a spec may follow (its `kind`): each renders its own way (reproduce/tables/).
TABLES = ("table2", "table3", "table4")
VARIANT_KEYS = {"set", "paper", "question"}
QUESTION_KEYS = {"asks", "against", "settled_if"}
SCALE_KEYS = {"about", "width", "steps", "corpus", "vocab", "set", "tune", "devices", "rows",
              "variants"}
# what a spec's own scale of a shared name may set alone, narrowing the shared scale to them
NARROWING_KEYS = {"rows", "variants"}
TUNE_KEYS = {"metric", "direction", "knobs"}
KNOB_KEYS = {"low", "high", "log", "choices"}


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _keys(data: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: "
                        f"{', '.join(sorted(allowed))}")


def _overrides(values: Any, where: str) -> dict[str, Any]:
    values = _mapping(values, where)
    try:
        config = apply_overrides(BASE, values)
        if any(k.rsplit(".", 1)[-1] in (*PART_SLOTS, "modules") for k in values):
            from reproduce.paper import slots  # the model's parts: torch, only when named

            slots.check_names(config.model)
    except ConfigError as e:
        raise SpecError(f"{where}: {e}") from None
    return values


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML 1.1 reads ``3.3e18`` (no dot, no exponent sign) as a string; read it as a float.
    Parsed by libyaml where PyYAML was built with it: ~8x faster than the pure-Python parser
    (the shipped specs, read several times by each command: 2.5 ms against 20)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise SpecError(f"{path}: no such sweep spec")
    try:
        data = yaml.load(path.read_text(), Loader=_Loader)
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    return _mapping(data, str(path))


def load_scales(path: Path, data: dict[str, Any], varied: set[str],
                rows: dict[str, list[str]] | None = None) -> dict[str, Scale]:
    """Scales from ``data`` (``path`` names the file in errors); ``rows``: the spec's rows, which
    its own scales may name (None for the shared scales, which are every table's: no ``rows:``)."""
    scales = {}
    for name, raw in data.items():
        where = f"{path.name}: scales.{name}"
        raw = _mapping(raw, where)
        _keys(raw, SCALE_KEYS, where)
        overrides = _overrides(raw.get("set"), f"{where}.set")
        # what a variant varies it may set too: the variant's value wins (``variant_overrides``)
        clash = sorted(set(overrides) & (set(WIDTH_FIELDS) | {"train_steps", "corpus"}))
        if clash:
            raise SpecError(f"{where}.set: {', '.join(clash)} resized by `width`/`steps` or "
                            "named by the spec; a scale may not set it")
        for factor in ("width", "steps"):
            value = raw.get(factor, 1)
            if not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise SpecError(f"{where}.{factor} = {value!r}: must be a number in (0, 1]")
        devices = raw.get("devices", 1)
        if devices != "auto" and (not isinstance(devices, int) or isinstance(devices, bool)
                                  or devices < 1):
            raise SpecError(f"{where}.devices = {devices!r}: must be a positive integer or auto")
        kept = raw.get("rows", [])
        if kept and rows is None:
            raise SpecError(f"{where}.rows: a shared scale is every table's and runs every row; "
                            "name rows in a table's own scale (its spec's `scales:`)")
        if not isinstance(kept, list) or not all(isinstance(r, str) for r in kept):
            raise SpecError(f"{where}.rows = {kept!r}: expected a list of row names")
        for row in kept:
            if row not in (rows or {}):
                raise SpecError(f"{where}.rows: unknown row {row!r}; valid rows: "
                                f"{', '.join(rows or {})}")
        only = raw.get("variants", [])
        if only and not kept:
            raise SpecError(f"{where}.variants: name the scale's rows first (`rows:`); its "
                            "variants are chosen from theirs")
        if not isinstance(only, list) or not all(isinstance(v, str) for v in only):
            raise SpecError(f"{where}.variants = {only!r}: expected a list of variant names")
        allowed = [v for row in kept for v in (rows or {})[row]]
        for variant in only:
            if variant not in allowed:
                raise SpecError(f"{where}.variants: {variant!r} is not a variant of its rows "
                                f"({', '.join(kept)}); valid: {', '.join(allowed)} (base always "
                                "runs)")
        scales[name] = Scale(name, str(raw.get("about", "")), float(raw.get("width", 1)),
                             float(raw.get("steps", 1)), _mapping(raw.get("corpus"), where),
                             _mapping(raw.get("vocab"), where), overrides,
                             load_knobs(raw.get("tune"), f"{where}.tune", varied), devices,
                             tuple(kept), tuple(only))
    return scales


def load_knobs(data: Any, where: str, varied: set[str]) -> dict[str, Knob]:
    """Tuned settings: config fields that no row varies and no scale resizes (nuisance knobs)."""
    knobs = {}
    for name, raw in _mapping(data, where).items():
        at = f"{where}.{name}"
        raw = _mapping(raw, at)
        _keys(raw, KNOB_KEYS, at)
        if name not in FIELDS:
            raise SpecError(f"{at}: unknown config key {name!r}; allowed keys: "
                            f"{', '.join(sorted(FIELDS))}")
        if name in varied | set(WIDTH_FIELDS) | {"train_steps", "corpus"}:
            raise SpecError(f"{at}: {name} is varied by a row or resized by a scale; only "
                            "nuisance settings may be tuned")
        choices = raw.get("choices")
        if choices is not None:
            if set(raw) != {"choices"} or not isinstance(choices, list) or not choices:
                raise SpecError(f"{at}: `choices` must be a non-empty list, without low/high/log")
            for value in choices:
                _overrides({name: value}, at)
            knobs[name] = Knob(name, choices=tuple(choices))
            continue
        low, high, log = raw.get("low"), raw.get("high"), raw.get("log", False)
        if not (isinstance(low, (int, float)) and isinstance(high, (int, float))) \
                or isinstance(low, bool) or isinstance(high, bool) or not isinstance(log, bool) \
                or not low < high or (log and low <= 0):
            raise SpecError(f"{at}: needs numbers low < high (both > 0 with log: true) or choices")
        _overrides({name: low}, at)
        _overrides({name: high}, at)
        knobs[name] = Knob(name, float(low), float(high), log)
    return knobs


def load_tuning(data: Any, where: str, varied: set[str]) -> Tuning | None:
    if data is None:
        return None
    data = _mapping(data, where)
    _keys(data, TUNE_KEYS, where)
    direction = data.get("direction", "maximize")
    if direction not in ("maximize", "minimize"):
        raise SpecError(f"{where}.direction = {direction!r}: allowed values are maximize, minimize")
    if not isinstance(data.get("metric"), str):
        raise SpecError(f"{where}.metric: name the dev metric to optimise (e.g. dev_f1)")
    knobs = load_knobs(data.get("knobs"), f"{where}.knobs", varied)
    if not knobs:
        raise SpecError(f"{where}.knobs: list at least one tuned setting")
    return Tuning(data["metric"], direction, knobs)


def load_spec(table_or_path: str | Path, kind: str | None = None) -> Spec:
    """Load ``sweeps/<table>.yaml`` (or a path) with the shared scales, validating every key.

    ``kind``: the paper's table the spec follows, as the command that runs it names it
    (``table2 --spec mine.yaml``); else the spec's own ``kind:``, else its ``table`` when that is
    one of ``TABLES``, else ``table3`` (variants against a base)."""
    path = Path(table_or_path)
    if not path.suffix:
        path = SWEEPS / f"{table_or_path}.yaml"
    data = _read_yaml(path)
    _keys(data, SPEC_KEYS, path.name)
    table = str(data.get("table", path.stem))
    kind = kind or str(data.get("kind", table if table in TABLES else "table3"))
    if kind not in TABLES:
        raise SpecError(f"{path.name}: kind {kind!r} unknown; allowed: {', '.join(TABLES)}")
    variants = {}
    for name, raw in _mapping(data.get("variants"), f"{path.name}: variants").items():
        where = f"{path.name}: variants.{name}"
        raw = _mapping(raw, where)
        _keys(raw, VARIANT_KEYS, where)
        question = _mapping(raw.get("question"), f"{where}.question")
        _keys(question, QUESTION_KEYS, f"{where}.question")
        if question and not (isinstance(question.get("against"), list)
                             and all(isinstance(question.get(k), str)
                                     for k in ("asks", "settled_if"))):
            raise SpecError(f"{where}.question: needs asks (text), against (a list of the runs "
                            "it is read against) and settled_if (text)")
        variants[str(name)] = Variant(str(name), _overrides(raw.get("set"), f"{where}.set"),
                                      _mapping(raw.get("paper"), f"{where}.paper"), question)
    if not variants:
        raise SpecError(f"{path.name}: variants: the spec lists no variants")
    rows = {str(k): v for k, v in _mapping(data.get("rows"), f"{path.name}: rows").items()}
    for row, names in rows.items():
        if not isinstance(names, list) or not names:
            raise SpecError(f"{path.name}: rows.{row}: expected a non-empty list of variants")
        for name in names:
            if name not in variants:
                raise SpecError(f"{path.name}: rows.{row}: unknown variant {name!r}; valid "
                                f"variants: {', '.join(variants)}")
    base = _overrides(data.get("base"), f"{path.name}: base")
    varied = {k for v in variants.values() for k in v.overrides}
    own = _mapping(data.get("scales"), f"{path.name}: scales")
    everyone = _read_yaml(SWEEPS / "scales.yaml")
    # A spec's own scale of a shared scale's name that sets only `rows` and `variants` narrows the
    # shared one to them; one that sets anything else replaces it, which is then not checked.
    own = {name: ({**_mapping(everyone[name], f"scales.yaml: {name}"), **raw}
                  if name in everyone and isinstance(raw, dict) and raw
                  and set(raw) <= NARROWING_KEYS else raw) for name, raw in own.items()}
    shared = {k: v for k, v in everyone.items() if k not in own}
    # a variant may set what a scale sets for every run: the variant's value wins, and the plan
    # says so (``Spec.variant_overrides``)
    scales = load_scales(SWEEPS / "scales.yaml", shared, set())
    scales.update(load_scales(path, own, varied, rows))
    cited = data.get("cited") or []
    if not isinstance(cited, list) or not all(isinstance(c, dict) for c in cited):
        raise SpecError(f"{path.name}: cited: expected a list of mappings (one per published row)")
    preset = str(data.get("preset", "base"))
    if preset not in PRESETS:
        raise SpecError(f"{path.name}: preset {preset!r} unknown; allowed: {', '.join(PRESETS)}")
    tuning = load_tuning(data.get("tune"), f"{path.name}: tune", varied)
    spec = Spec(path, table, str(data.get("caption", "")), str(data.get("split", "dev")),
                base, variants, rows, scales, cited, preset, tuning, kind)
    for name in variants:  # every variant must be buildable at every scale
        for scale in scales:
            try:
                spec.resolve(name, scale)
            except ConfigError as e:
                raise SpecError(f"{path.name}: variant {name} at scale {scale}: {e}") from None
    return spec


def shipped_specs() -> list[Path]:
    return sorted(p for p in SWEEPS.glob("*.yaml") if p.name != "scales.yaml")


def planned_summary(run: PlannedRun, overrides: dict[str, Any]) -> str:
    """One line of the plan: the run, the overrides its variant names and what they resolve to."""
    t = run.config.train
    model = " ".join(f"{name}={value}" for name, value in model_items(run.config.model,
                                                                      ("shape", "dropout")))
    return (f"{run.run_id}: overrides {overrides or '{}'} -> {model} eps_ls={t.eps_ls} "
            f"steps={t.train_steps} batch_tokens={t.batch_tokens} "
            f"corpus={run.config.data.corpus}")


def with_data(run: PlannedRun, data_dir: str | None = None,
              extra_trees: str | None = None) -> PlannedRun:
    """``run`` on the user's data (``--treebank``, ``--silver``). Local data gets its own run id
    (tag ``ptb``): a run on NLTK's sample is never taken for one on the full treebank."""
    overrides = {k: v for k, v in (("data_dir", data_dir), ("extra_trees", extra_trees)) if v}
    if not overrides:
        return run
    tag = "-".join(t for t in (run.tag, "ptb" if data_dir else "") if t)
    return replace(run, config=run.config.overrides(**overrides), tag=tag)


def with_sets(runs: list[PlannedRun], spec: Spec, sets: dict[str, Any]) -> list[PlannedRun]:
    """``runs`` with the command line's ``--set`` values (``config.parse_sets``) on top of the
    spec and scale. A key one of the runs' rows varies is refused: it is what the row compares."""
    if not sets:
        return runs
    for run in runs:
        varied = sorted(set(sets) & set(spec.variants[run.variant].overrides))
        if varied:
            row = spec.row_of(run.variant)
            own = ", ".join(f"{k}={spec.variants[run.variant].overrides[k]}" for k in varied)
            raise ConfigError(f"--set {', '.join(varied)}: row {row} varies it ({run.variant} "
                              f"sets {own}); leave it to the row, or choose other rows")
    return [replace(run, config=with_modules(run.config.overrides(**sets)), sets=dict(sets))
            for run in runs]


def with_modules(config: Config) -> Config:
    """``config`` with its own modules (``model.modules``) pinned to their files' SHA-256 and
    checked before anything trains: they import, the parts they name are registered and keep
    their input's shape (``paper.slots``)."""
    if not config.model.modules:
        return config
    from reproduce.paper import slots  # torch, only for a spec that names modules

    config = config.overrides(modules=slots.resolve_modules(config.model.modules))
    slots.check_parts(config.model)
    return config


def sets_line(runs: list[PlannedRun], sets: dict[str, Any]) -> str:
    """The plan's line for ``--set``, from the runs before it applies: each key's value in the
    spec and scale (several: they differ between runs) and the value set."""
    def was(key: str) -> str:
        values = sorted({repr(r.config.value(key)) for r in runs})
        return values[0] if len(values) == 1 else "/".join(values)
    return "  --set, for every run: " + ", ".join(f"{k} {was(k)} -> {v!r}" for k, v in sets.items()) \
        + " (recorded as `set`)"
