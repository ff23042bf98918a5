"""The parts of the model a config value picks by name: the positional encoding
(``model.positions``), the feed-forward sublayer (``model.feed_forward``) and the sublayer wiring,
where each LayerNorm sits (``model.wiring``). The paper's parts are registered here under their
names, as a part of one's own is: ``register(slot, name)`` on a factory taking the
``ModelConfig``.

* ``positions``: a module whose ``forward(length, offset=0)`` gives (length, d_model), added to
  the scaled embeddings of each stack (one module a stack). ``sinusoidal`` is section 3.5;
  ``learned`` is Table 3 row E (``model.positions_init`` starts its table).

* ``feed_forward``: a module mapping (.., d_model) to (.., d_model). ``relu`` is equation 2.
* ``wiring``: how a sublayer joins its residual stream, as ``before(x, norm)`` (the sublayer's
  input) and ``after(x, out, norm, drop)`` (the stream after it), and whether each stack ends
  in a LayerNorm of its own (``final_norm``). ``post-norm`` is the paper's
  LayerNorm(x + Dropout(Sublayer(x))) (section 3.1); ``pre-norm`` is
  x + Dropout(Sublayer(LayerNorm(x))) with a final LayerNorm on each stack, as fairseq's
  ``--encoder-normalize-before`` and ``nn.Transformer(norm_first=True)`` with its final norms.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from reproduce.config import PART_SLOTS, ModelConfig
from reproduce.errors import ConfigError

SLOTS = PART_SLOTS  # config.py's, declared there beside the fields that name them
_REGISTRY: dict[str, dict[str, Callable[[ModelConfig], Any]]] = {slot: {} for slot in SLOTS}


def register(slot: str, name: str) -> Callable:
    """Register ``factory(config)`` as ``name`` in ``slot``; one name, one factory."""
    def decorate(factory: Callable[[ModelConfig], Any]) -> Callable[[ModelConfig], Any]:
        if slot not in _REGISTRY:
            raise ConfigError(f"register({slot!r}, {name!r}): no such slot; the slots are "
                              f"{', '.join(SLOTS)}")
        known = _REGISTRY[slot].get(name)
        if known is not None and known is not factory:
            raise ConfigError(f"register({slot!r}, {name!r}): {name!r} is registered twice "
                              f"(by {_file(known)} and {_file(factory)})")
        _REGISTRY[slot][name] = factory
        return factory
    return decorate


def names(slot: str) -> tuple[str, ...]:
    return tuple(_REGISTRY[slot])


def build(slot: str, config: ModelConfig) -> Any:
    """The part ``config`` names in ``slot`` (``config.<slot>``), or a one-line ``ConfigError``
    naming the field and the values it may take."""
    load_modules(config.modules)
    return _factory(slot, config)(config)


def _factory(slot: str, config: ModelConfig) -> Callable[[ModelConfig], Any]:
    factory = _REGISTRY[slot].get(getattr(config, slot))
    if factory is None:
        raise ConfigError(f"model.{slot} = {getattr(config, slot)!r}: allowed values are "
                          f"{', '.join(names(slot))}")
    return factory


# --- modules of one's own ---------------------------------------------------------------------

_LOADED: dict[str, str] = {}  # a module's file -> its SHA-256, once imported in this process
HASHED = 16  # hex digits of a module's SHA-256 kept in a planned run's config


def module_file(ref: str) -> Path:
    """The file of a module named in ``model.modules``: a .py path, or an importable name."""
    if ref.endswith(".py") or "/" in ref:
        path = Path(ref).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"{ref}: no such file (model.modules)")
        return path
    try:
        found = importlib.util.find_spec(ref)
    except (ImportError, ValueError) as e:
        raise ConfigError(f"{ref}: not importable (model.modules): {e}") from None
    if found is None or not found.origin or not Path(found.origin).is_file():
        raise ConfigError(f"{ref}: no such module (model.modules): a .py file's path, or a name "
                          "Python can import")
    return Path(found.origin)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def resolve_modules(modules: str) -> str:
    """``model.modules`` as a planned run holds it: each module as given (a path read from where
    the command runs, as a corpus's ``data_dir``, or an import name) with the SHA-256 prefix of
    its file now, so a run's config, and so its record, changes when its code does (the old
    record is then stale, as after any change of config)."""
    out = []
    for ref in (r.strip() for r in modules.split(",") if r.strip()):
        name = ref.split("#", 1)[0]
        out.append(f"{name}#{sha256(module_file(name))[:HASHED]}")
    return ",".join(out)


def load_modules(modules: str) -> list[Path]:
    """Import each module of ``model.modules`` once in this process (their ``register`` calls
    fill the slots); one line naming the file where one is missing, fails to import, or changed
    since its run was planned (its SHA-256 prefix). The files, in order."""
    files = []
    for ref in (r.strip() for r in modules.split(",") if r.strip()):
        name, _, planned = ref.partition("#")
        path = module_file(name)
        files.append(path)
        if str(path) in _LOADED:
            continue
        digest = sha256(path)
        if planned and not digest.startswith(planned):
            raise ConfigError(f"{path}: changed since its run was planned (SHA-256 {planned}..., "
                              f"now {digest[:HASHED]}...): run the command again to plan it anew")
        _LOADED[str(path)] = digest
        try:
            if name.endswith(".py") or "/" in name:
                spec = importlib.util.spec_from_file_location(  # a name of its own per file
                    f"reproduce_module_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}", path)
                assert spec is not None and spec.loader is not None
                module = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = module
                spec.loader.exec_module(module)
            else:
                importlib.import_module(name)
        except ConfigError as e:
            del _LOADED[str(path)]
            raise ConfigError(f"{path}: {e}") from None
        except Exception as e:  # noqa: BLE001 - any failure of a user's module is one line
            del _LOADED[str(path)]
            raise ConfigError(f"{path}: failed to import: {type(e).__name__}: {e}") from None
    return files


def sources(modules: str) -> dict[str, dict[str, str]]:
    """What a record keeps of a run's own modules, as of a user's corpus: each file's SHA-256 and
    a copy of its source, by the name the config gives it."""
    return {ref.split("#", 1)[0]: {"sha256": sha256(path), "source": path.read_text()}
            for ref, path in zip([r.strip() for r in modules.split(",") if r.strip()],
                                 load_modules(modules), strict=True)}


def check_parts(config: ModelConfig) -> None:
    """Before anything trains: the modules load, every slot's name is registered, and a part of
    one's own maps (1, 2, d_model) to (1, 2, d_model); one line naming the file otherwise."""
    check_names(config)
    positions = _factory("positions", config)
    if positions not in (sinusoidal, learned):
        try:
            with torch.device("meta"):
                shape = tuple(positions(config)(2).shape)
        except Exception as e:  # noqa: BLE001
            raise ConfigError(f"{_file(positions)}: model.positions {config.positions!r} fails "
                              f"for 2 positions: {type(e).__name__}: {e}") from None
        if shape != (2, config.d_model):
            raise ConfigError(f"{_file(positions)}: model.positions {config.positions!r} gives "
                              f"{shape} for 2 positions; it must give (2, {config.d_model})")
    factory = _factory("feed_forward", config)
    if factory is relu_feed_forward:
        return
    try:
        with torch.device("meta"):
            out = factory(config)(torch.zeros(1, 2, config.d_model))
        shape = tuple(out.shape)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"{_file(factory)}: model.feed_forward {config.feed_forward!r} fails on "
                          f"a (1, 2, {config.d_model}) input: {type(e).__name__}: {e}") from None
    if shape != (1, 2, config.d_model):
        raise ConfigError(f"{_file(factory)}: model.feed_forward {config.feed_forward!r} maps a "
                          f"(1, 2, {config.d_model}) input to {shape}; it must keep the shape")


def _file(factory: Callable) -> str:
    module = sys.modules.get(factory.__module__)
    return str(getattr(module, "__file__", None) or factory.__module__)


def check_names(config: ModelConfig) -> None:
    """A one-line ``ConfigError`` where ``config`` names a part no one registered (its modules
    loaded first)."""
    load_modules(config.modules)
    for slot in SLOTS:
        _factory(slot, config)


# --- the paper's parts, and pre-LN --------------------------------------------------------------


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (equation 2)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(F.relu(self.w_1(x)))


@register("feed_forward", "relu")
def relu_feed_forward(config: ModelConfig) -> nn.Module:
    return PositionwiseFeedForward(config.d_model, config.d_ff)


def sinusoid_table(length: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    inv_freq = torch.pow(10000.0, -torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    table = torch.zeros(length, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq)
    return table.float()


class SinusoidalPositions(nn.Module):
    """The sinusoid of section 3.5, computed once and grown on demand."""

    table: Tensor  # (positions, d_model): a buffer, grown when a longer sequence comes
    def __init__(self, d_model: int, max_positions: int):
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", sinusoid_table(max_positions, d_model), persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        if offset + length > self.table.shape[0]:  # longer than ever seen: extend, no hard limit
            self.table = sinusoid_table(offset + length, self.d_model).to(self.table.device)
        return self.table[offset:offset + length]


class LearnedPositions(nn.Module):
    """Table 3 row E: a learned embedding per position instead of the sinusoid."""

    def __init__(self, d_model: int, max_positions: int, init: str = "xavier"):
        super().__init__()
        self.table = nn.Embedding(max_positions, d_model)
        self.init = init  # config.POSITION_INITS: how reset_parameters starts the table

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Xavier-uniform (as every matrix), the sinusoid itself, or normal noise at the
        sinusoid's RMS (1/sqrt(2): each sin, cos pair has unit norm)."""
        w = self.table.weight
        if self.init == "sinusoid":
            w.copy_(sinusoid_table(w.shape[0], w.shape[1]))
        elif self.init == "sinusoid-rms":
            nn.init.normal_(w, std=0.5 ** 0.5)
        else:
            nn.init.xavier_uniform_(w)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        if offset + length > self.table.num_embeddings:
            raise ValueError(f"position {offset + length - 1} is beyond the learned table's "
                             f"{self.table.num_embeddings} positions (model.max_positions)")
        return self.table.weight[offset:offset + length]


@register("positions", "sinusoidal")
def sinusoidal(config: ModelConfig) -> nn.Module:
    return SinusoidalPositions(config.d_model, config.max_positions)


@register("positions", "learned")
def learned(config: ModelConfig) -> nn.Module:
    return LearnedPositions(config.d_model, config.max_positions, config.positions_init)


class PostNorm:
    """LayerNorm(x + Dropout(Sublayer(x))): the paper's (section 3.1)."""

    final_norm = False

    def before(self, x: Tensor, norm: nn.Module) -> Tensor:
        return x

    def after(self, x: Tensor, out: Tensor, norm: nn.Module, drop: nn.Module) -> Tensor:
        return norm(x + drop(out))


class PreNorm:
    """x + Dropout(Sublayer(LayerNorm(x))), and a final LayerNorm on each stack."""

    final_norm = True

    def before(self, x: Tensor, norm: nn.Module) -> Tensor:
        return norm(x)

    def after(self, x: Tensor, out: Tensor, norm: nn.Module, drop: nn.Module) -> Tensor:
        return x + drop(out)


@register("wiring", "post-norm")
def post_norm(config: ModelConfig) -> PostNorm:
    return PostNorm()


@register("wiring", "pre-norm")
def pre_norm(config: ModelConfig) -> PreNorm:
    return PreNorm()
