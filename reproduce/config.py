"""Typed, validated configs and the paper's named presets.

Every knob is one of three kinds (google-research/tuning_playbook):
*scientific* (what a table row varies: the model sizes, dropout, label smoothing, positions, steps),
*nuisance* (tuned, never varied by a row: learning-rate scale, warm-up) or *fixed* (protocol: Adam's
betas, beam size, length penalty). Defaults are the paper's base model (section 3, 5, 6).

Overrides are flat ``{field: value}`` maps, as the paper's tables write them (``{h: 1, d_k: 512}``);
field names are unique across sections so a flat key always names one field.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field, fields, replace
from types import UnionType
from typing import Any, Literal, get_args, get_origin, get_type_hints

from reproduce.errors import ConfigError

# How a learned position table starts (the paper does not say): "xavier" (Xavier-uniform, as every
# matrix), "sinusoid" (the sinusoid itself: at step 0 the model is the sinusoidal one) or
# "sinusoid-rms" (normal noise at the sinusoid's RMS, 1/sqrt(2): as loud, no order).
POSITION_INITS = ("xavier", "sinusoid", "sinusoid-rms")
# Initialization (the paper states none): "xavier" is Xavier-uniform for every matrix (tensor2tensor's
# uniform unit scaling); "depth-scaled" also shrinks the last projection of every residual branch
# by 1/sqrt(residual sublayers in its stack), see Transformer.reset_parameters.
INITS = ("xavier", "depth-scaled")
# "auto": bf16-mixed where the hardware runs it fast (CUDA with bf16, CPUs with AMX), else 32-true.
PRECISIONS = ("auto", "32-true", "bf16-mixed", "16-mixed", "bf16-true")
# train.compile: "auto" times it (reproduce.train.compiling); YAML's true/false (and on/off, which
# YAML reads as booleans) mean "on"/"off", as records written before "auto" existed hold them
COMPILES = ("off", "on", "auto")
# Where a run trains (``--accelerator``; ``train.devices``): here, torch-free, for the CLI's --help.
ACCELERATORS = ("auto", "cpu", "gpu")
# Parse-tree targets (Table 4): POS tags kept, every tag normalized to XX, or the words themselves
# in the tags' place (not the paper's; reproduce/paper/parsing.py).
LINEARIZATIONS = ("tags", "xx", "words")
# data.vocabulary: sentencepiece BPE pieces (the paper's, section 5.1) or one token a word
# (paper.tokenizer.WordTokenizer: a small treebank's stand-in for the paper's 16K pieces on WSJ).
VOCABULARIES = ("bpe", "words")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


# What a model field is to the places that tell models apart (timing caches, plans, the parameter
# column, speed reports: ``model_identity``), declared once on the field: "shape" changes what a
# step computes (its time, FLOPs and parameters), "dropout" only what it drops, "size" parameters
# but not the step (a learned table's rows), "start" only the weights a run starts from, "id"
# nothing a step computes. A field that declares no kind counts as a shape: a new knob is told
# apart everywhere until it says otherwise. ``key`` is its short name in an identity ("d512").
KINDS = ("shape", "dropout", "size", "start", "id")
# The model fields that name a part of paper/slots.py's registry (checked where a spec is read)
PART_SLOTS = ("positions", "feed_forward", "wiring")


def _knob(default: Any, kind: str, key: str | None = None) -> Any:
    return field(default=default, metadata={"kind": kind, "key": key})


def kind_of(f: dataclasses.Field) -> str:
    return f.metadata.get("kind", "shape")


def model_items(m: Any, kinds: tuple[str, ...] = ("shape",)) -> list[tuple[str, Any]]:
    """(field name, value) of ``m``'s model fields of ``kinds``, in declaration order: every
    field of its class, its own knobs included."""
    return [(f.name, getattr(m, f.name)) for f in fields(m) if kind_of(f) in kinds]


def model_identity(m: Any, kinds: tuple[str, ...] = ("shape",)) -> str:
    """The model's fields of ``kinds`` as one key, e.g. ``V37000-N6-d512-ff2048-h8-k64-v64-
    sinusoidal``: equal for two models exactly when those fields are."""
    keys = {f.name: f"{f.name}=" if f.metadata.get("key") is None else f.metadata["key"]
            for f in fields(m)}
    return "-".join(f"{keys[name]}{value}" for name, value in model_items(m, kinds))


@dataclass(frozen=True)
class ModelConfig:
    """The Transformer's shape (section 3; Table 3's columns N, d_model, d_ff, h, d_k, d_v, P_drop)."""

    vocab_size: int = _knob(37000, "shape", "V")  # shared source-target BPE vocabulary (5.1)
    N: int = _knob(6, "shape", "N")  # layers per stack
    d_model: int = _knob(512, "shape", "d")
    d_ff: int = _knob(2048, "shape", "ff")
    h: int = _knob(8, "shape", "h")
    d_k: int = _knob(64, "shape", "k")  # per-head query/key size; free, not d_model/h (rows A-C)
    d_v: int = _knob(64, "shape", "v")  # per-head value size
    p_drop: float = _knob(0.1, "dropout")  # residual and embedding dropout (section 5.4)
    # Attention-weight dropout is not specified for translation; 0 keeps to the paper's text.
    # Table 4's parser tunes it.
    p_attn: float = _knob(0.0, "dropout")
    positions: str = _knob("sinusoidal", "shape", "")  # "learned" is Table 3 row E
    # the feed-forward sublayer and where each LayerNorm sits: names in paper/slots.py's registry
    feed_forward: str = _knob("relu", "shape", "")  # "relu": equation 2
    wiring: str = _knob("post-norm", "shape", "")  # "pre-norm": a LayerNorm before each sublayer
    # Modules of one's own that register parts (paper/slots.py), comma-separated: .py files or
    # importable names; each planned run holds them as "<path or name>#<SHA-256 prefix>"
    modules: str = _knob("", "id")
    positions_init: str = _knob("xavier", "start")  # a learned table's start (POSITION_INITS)
    max_positions: int = _knob(1024, "size")  # the learned position table / sinusoid cache
    pad_id: int = _knob(0, "id")
    init: str = _knob("xavier", "start")  # a nuisance setting: "depth-scaled" by scales (INITS)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "N", "d_model", "d_ff", "h", "d_k", "d_v", "max_positions"):
            value = getattr(self, name)
            _check(value > 0, f"model.{name} = {value}: must be a positive integer")
        for name in ("p_drop", "p_attn"):
            value = getattr(self, name)
            _check(0.0 <= value < 1.0, f"model.{name} = {value}: must be in [0, 1)")
        _check(
            self.positions_init in POSITION_INITS,
            f"model.positions_init = {self.positions_init!r}: allowed values are "
            f"{', '.join(POSITION_INITS)}",
        )
        _check(
            self.positions == "learned" or self.positions_init == "xavier",
            f"model.positions_init = {self.positions_init!r}: only a learned position table "
            "is initialised; set positions: learned, or leave positions_init at xavier",
        )
        _check(
            self.init in INITS,
            f"model.init = {self.init!r}: allowed values are {', '.join(INITS)}",
        )
        _check(
            self.positions != "sinusoidal" or self.d_model % 2 == 0,
            f"model.d_model = {self.d_model}: sinusoidal positions need an even d_model "
            "(sin and cos come in pairs); use an even size or positions: learned",
        )
        _check(
            0 <= self.pad_id < self.vocab_size,
            f"model.pad_id = {self.pad_id}: must be in [0, vocab_size={self.vocab_size})",
        )


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation (section 5.2-5.4). ``lr_scale`` and ``warmup_steps`` are nuisance settings."""

    train_steps: int = 100_000
    warmup_steps: int = 4000
    lr_scale: float = 1.0  # multiplies the paper's lrate formula; 1.0 is the paper
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-9
    eps_ls: float = 0.1  # label smoothing (section 5.4)
    batch_tokens: int = 25_000  # source (and target) tokens per optimizer step, over all devices
    # Most tokens one device takes per forward pass; fewer devices reach `batch_tokens` by
    # gradient accumulation (0: one pass per step per device; "auto": the fewest passes that fit
    # the device's measured memory, reproduce.train.micro_batch).
    device_batch_tokens: int | str = 0
    max_tokens_per_sentence: int = 256  # longer pairs are dropped and counted (OOM pitfall)
    # Training batches in at most this many shapes an epoch, fitted to the corpus's lengths
    # (reproduce.data.batching.Shapes), for what needs few shapes: static compiled graphs, CUDA
    # graphs, cuDNN's attention; 0: each batch as wide as its longest pair (less padding).
    batch_shapes: int = 0
    precision: str = "32-true"  # the paper trained in fp32; scales may choose "auto"
    # Checkpoints for averaging (Table 2): one every `ckpt_every_minutes` (the paper: 10) or, at
    # small scales, every `ckpt_every_steps`; the last `average_last` are averaged (1: none).
    ckpt_every_minutes: float = 0.0
    ckpt_every_steps: int = 0
    average_last: int = 1
    # Weights chosen on dev (Table 4): the last `pick_on_dev` step checkpoints are kept, each and
    # their average decoded on the dev split, and the best by the task's dev metric is scored on
    # test (reproduce.train.pick); 0: the final weights (or the average of `average_last`).
    pick_on_dev: int = 0
    val_every_steps: int = 0  # 0: validate once, at the end
    seed: int = 0
    # torch.compile of the training loss (the model's forward and the loss, so the backward):
    # same function, other kernels; measured by `bench --compile` (0.8x eager on a 2-core CPU).
    # "auto": taken where a timed step says it pays over the run (reproduce.train.compiling)
    compile: str = "off"
    # On the fast path on a GPU: each batch shape's compiled step replayed as a CUDA graph
    # (inductor's cudagraph trees: one kernel launch from the host per graph); for few shapes
    # (batch_shapes). No effect eager or on a CPU. Not yet measured on a GPU.
    cuda_graphs: bool = False

    def save_interval(self) -> tuple[str, float]:
        """How often a checkpoint is saved: ``("minutes", N)`` where ``ckpt_every_minutes`` is
        set, else ``("steps", N)``: ``ckpt_every_steps``, or a tenth of the run."""
        if self.ckpt_every_minutes:
            return "minutes", self.ckpt_every_minutes
        return "steps", self.ckpt_every_steps or max(1, self.train_steps // 10)

    def kept_checkpoints(self) -> int:
        """Step checkpoints a run keeps: those it averages, or those the dev pick weighs."""
        return max(self.average_last, self.pick_on_dev)

    def split_batch(self, devices: int) -> tuple[int, int]:
        """(micro-batches accumulated per step, tokens per micro-batch per device) so that
        devices x accumulated x micro-batch tokens reaches ``batch_tokens`` (the paper's tokens
        per step, section 5.1) on any device count.

        Pitfall this avoids: fewer GPUs than the paper's 8 silently train with smaller batches."""
        per_device = -(-self.batch_tokens // devices)  # ceil
        # "auto" before micro_batch.resolve has measured: one pass, which it takes where it fits
        limit = per_device if self.device_batch_tokens == "auto" else (
            int(self.device_batch_tokens) or per_device)
        accumulate = -(-per_device // limit)
        return accumulate, -(-per_device // accumulate)

    def __post_init__(self) -> None:
        for name in ("train_steps", "warmup_steps", "batch_tokens", "max_tokens_per_sentence",
                     "average_last"):
            value = getattr(self, name)
            _check(value > 0, f"train.{name} = {value}: must be a positive integer")
        _check(self.device_batch_tokens == "auto" or (
            isinstance(self.device_batch_tokens, int) and not isinstance(self.device_batch_tokens, bool)
            and self.device_batch_tokens >= 0),
            f"train.device_batch_tokens = {self.device_batch_tokens!r}: allowed values are an "
            "integer >= 0 (0: one pass a step) or auto")
        for name in ("ckpt_every_steps", "val_every_steps", "seed", "pick_on_dev",
                     "ckpt_every_minutes", "batch_shapes"):
            value = getattr(self, name)
            _check(value >= 0, f"train.{name} = {value}: must be >= 0")
        _check(not (self.pick_on_dev and self.average_last > 1),
               f"train.pick_on_dev = {self.pick_on_dev} with train.average_last = "
               f"{self.average_last}: one way to choose the weights (pick_on_dev weighs the "
               "average of the last checkpoints too); set average_last 1 or pick_on_dev 0")
        _check(self.lr_scale > 0, f"train.lr_scale = {self.lr_scale}: must be > 0")
        _check(0.0 <= self.eps_ls < 1.0, f"train.eps_ls = {self.eps_ls}: must be in [0, 1)")
        for name in ("adam_beta1", "adam_beta2"):
            value = getattr(self, name)
            _check(0.0 <= value < 1.0, f"train.{name} = {value}: must be in [0, 1)")
        _check(self.adam_eps > 0, f"train.adam_eps = {self.adam_eps}: must be > 0")
        _check(
            self.precision in PRECISIONS,
            f"train.precision = {self.precision!r}: allowed values are {', '.join(PRECISIONS)}",
        )
        _check(self.compile in COMPILES,
               f"train.compile = {self.compile!r}: allowed values are {', '.join(COMPILES)}")


@dataclass(frozen=True)
class DecodeConfig:
    """Inference (section 6.1): beam 4, length penalty alpha 0.6, max length = input + 50."""

    beam: int = 4
    alpha: float = 0.6
    max_len_offset: int = 50
    # Parse trees (Table 4): only outputs that are well-formed trees with one word slot per input
    # word (decoding.TreeConstraint). Not in the paper, which repairs what the model writes.
    constrained: bool = False

    def __post_init__(self) -> None:
        _check(self.beam > 0, f"decode.beam = {self.beam}: must be a positive integer")
        _check(self.alpha >= 0, f"decode.alpha = {self.alpha}: must be >= 0")
        _check(self.max_len_offset > 0,
               f"decode.max_len_offset = {self.max_len_offset}: must be a positive integer")


@dataclass(frozen=True)
class DataConfig:
    """Which corpus, and how much of it (0 = all). Scales set these; rows never do."""

    corpus: str = "bible-en-de"
    data_dir: str = ""  # local files in the `datasets` layout instead of the hub ("" = none)
    # Treebank corpora (Table 4): a file or folder of bracketed trees added to the training split,
    # e.g. the semi-supervised row's ~17M silver trees ("" = none).
    extra_trees: str = ""
    # Treebank corpora: each word's POS tag in the target ("tags", what the paper trained on;
    # sweeps/table4.yaml sets it) or every tag normalized to XX ("xx", Vinyals & Kaiser et al.,
    # the default because runs recorded before this field existed used it), or the words themselves
    # ("words": not the paper's, see reproduce/paper/parsing.py).
    linearization: str = "xx"
    # "bpe": pieces (section 5.1); "words": one token a word, `vocab_size` its budget: the most
    # frequent training words seen at least twice, every other word its shape (``<unk-Cap-s>``).
    vocabulary: str = "bpe"
    max_train_pairs: int = 0
    max_eval_pairs: int = 0
    # Every k-th training pair (1 = all): a corpus k times smaller, spread over all its books, for
    # probes of how a result depends on the amount of data (max_train_pairs keeps the first pairs,
    # i.e. the first books). The vocabulary is still learned from every training pair, so dev
    # PPL stays comparable across k.
    train_every: int = 1

    def __post_init__(self) -> None:
        for name in ("max_train_pairs", "max_eval_pairs"):
            value = getattr(self, name)
            _check(value >= 0, f"data.{name} = {value}: must be >= 0 (0 = all)")
        _check(self.train_every >= 1,
               f"data.train_every = {self.train_every}: must be >= 1 (1 = every training pair)")
        _check(bool(self.corpus), "data.corpus is empty: name a corpus")
        _check(self.linearization in LINEARIZATIONS,
               f"data.linearization = {self.linearization!r}: one of {', '.join(LINEARIZATIONS)}")
        _check(self.vocabulary in VOCABULARIES,
               f"data.vocabulary = {self.vocabulary!r}: one of {', '.join(VOCABULARIES)}")


@dataclass(frozen=True)
class Config:
    """One run's complete setup: model, training and decoding."""

    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    data: DataConfig = field(default_factory=DataConfig)

    def overrides(self, **flat: Any) -> Config:
        """A copy with flat ``field=value`` overrides applied; unknown fields and bad types fail."""
        return apply_overrides(self, flat)

    def value(self, name: str) -> Any:
        """A field's value by its flat name (``h``, ``warmup_steps``): names are unique across
        sections (``FIELDS``)."""
        return getattr(getattr(self, FIELDS[name][0]), name)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, dict[str, Any]]) -> Config:
        """Inverse of ``to_dict`` (records store configs this way); keys are validated."""
        unknown = set(data) - set(SECTIONS)
        _check(not unknown, f"config: unknown section(s) {sorted(unknown)}; allowed: "
               f"{', '.join(SECTIONS)}")
        flat = {f"{s}.{k}": v for s, values in data.items() for k, v in values.items()}
        return apply_overrides(cls(), flat)


SECTIONS = {"model": ModelConfig, "train": TrainConfig, "decode": DecodeConfig,
            "data": DataConfig}


def _field_index() -> dict[str, tuple[str, type]]:
    index: dict[str, tuple[str, type]] = {}
    for section, cls in SECTIONS.items():
        hints = get_type_hints(cls)
        for f in fields(cls):
            assert f.name not in index, f"field {f.name} is defined in two sections"
            index[f.name] = (section, hints[f.name])
    return index


FIELDS = _field_index()


def _coerce(key: str, value: Any, kind: type) -> Any:
    """Check a YAML/CLI value against the field's type; ints are accepted where floats are."""
    if key.rsplit(".", 1)[-1] == "compile" and isinstance(value, bool):
        return "on" if value else "off"
    if get_origin(kind) is Literal:
        kind = type(get_args(kind)[0])
    if isinstance(kind, UnionType):  # int | str: the value is checked by the section
        return int(value) if isinstance(value, float) and value.is_integer() else value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ConfigError(f"{key} = {value!r}: expected {kind.__name__}, got {type(value).__name__}")
    return value


def apply_overrides(config: Config, overrides: dict[str, Any]) -> Config:
    """Apply flat overrides (``{"h": 1, "d_k": 512}``; ``"model.h"`` is accepted too)."""
    per_section: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        name = key.split(".", 1)[1] if "." in key else key
        if name not in FIELDS or ("." in key and key.split(".", 1)[0] != FIELDS[name][0]):
            raise ConfigError(
                f"unknown config key {key!r}; allowed keys: {', '.join(sorted(FIELDS))}"
            )
        section, kind = FIELDS[name]
        per_section.setdefault(section, {})[name] = _coerce(key, value, kind)
    return replace(
        config,
        **{s: replace(getattr(config, s), **vals) for s, vals in per_section.items()},
    )


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+")


def parse_sets(items: list[str], flag: str = "--set") -> dict[str, Any]:
    """``--set`` on the command line: ``["train.warmup_steps=8000", "beam=8"]`` ->
    ``{"warmup_steps": 8000, "beam": 8}``. Keys are a config field, with or without its section;
    values are read as YAML scalars and checked against the field's type (``ConfigError``)."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} {item!r}: expected SECTION.FIELD=VALUE, e.g. "
                              "train.warmup_steps=8000 (or FIELD=VALUE)")
        value = yaml.safe_load(text)
        if isinstance(value, str) and _NUMBER.fullmatch(value):  # YAML 1.1 reads 1e12 as text
            value = float(value)
        apply_overrides(BASE, {key: value})  # unknown key or wrong type: one line
        out[key.split(".", 1)[-1]] = value
    return out


# --- Named presets ------------------------------------------------------------------------------

# Base model: section 3 and Table 3's first row.
BASE = Config()

# Big model: Table 3's last row (d_model 1024, d_ff 4096, h 16, P_drop 0.3, 300K steps).
# EN-FR big uses P_drop 0.1 (section 6.1); Table 2's spec sets that.
BIG = BASE.overrides(d_model=1024, d_ff=4096, h=16, d_k=64, d_v=64, p_drop=0.3,
                     train_steps=300_000)

# Constituency parser (section 6.3): 4 layers, d_model 1024, "everything else as the EN-DE base".
# d_ff and h are not printed; we keep base's d_ff 2048 and h 8 (so d_k = d_v = 1024/8 = 128), as in
# tensor2tensor's transformer_parsing_base. Vocabulary 16K (WSJ only); beam 21, alpha 0.3, +300.
PARSING = BASE.overrides(N=4, d_model=1024, d_k=128, d_v=128, vocab_size=16000,
                         beam=21, alpha=0.3, max_len_offset=300)

PRESETS: dict[str, Config] = {"base": BASE, "big": BIG, "parsing": PARSING}


def seconds_from_env(name: str, default: float, about: str = "") -> float:
    """Seconds set by the environment variable ``name``, ``default`` when it is unset; anything
    but a number above 0 is one line (``ConfigError``) naming the variable (and ``about``: what
    it sets)."""
    import os

    value = os.environ.get(name)
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise ConfigError(f"{name}={value!r}: allowed values are seconds above 0"
                          + (f" ({about})" if about else ""))
    return seconds
