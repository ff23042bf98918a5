"""The parts of the model a config value picks by name: the feed-forward sublayer
(``model.feed_forward``) and the sublayer wiring, where each LayerNorm sits
(``model.wiring``). The paper's parts are registered here under their names, as a part of
one's own is: ``register(slot, name)`` on a factory taking the ``ModelConfig``.

* ``feed_forward``: a module mapping (.., d_model) to (.., d_model). ``relu`` is equation 2.
* ``wiring``: how a sublayer joins its residual stream, as ``before(x, norm)`` (the sublayer's
  input) and ``after(x, out, norm, drop)`` (the stream after it), and whether each stack ends
  in a LayerNorm of its own (``final_norm``). ``post-norm`` is the paper's
  LayerNorm(x + Dropout(Sublayer(x))) (section 3.1); ``pre-norm`` is
  x + Dropout(Sublayer(LayerNorm(x))) with a final LayerNorm on each stack, as fairseq's
  ``--encoder-normalize-before`` and ``nn.Transformer(norm_first=True)`` with its final norms.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
                              f"(by {_origin(known)} and {_origin(factory)})")
        _REGISTRY[slot][name] = factory
        return factory
    return decorate


def names(slot: str) -> tuple[str, ...]:
    return tuple(_REGISTRY[slot])


def build(slot: str, config: ModelConfig) -> Any:
    """The part ``config`` names in ``slot`` (``config.<slot>``), or a one-line ``ConfigError``
    naming the field and the values it may take."""
    check_names(config)
    return _REGISTRY[slot][getattr(config, slot)](config)


def check_names(config: ModelConfig) -> None:
    """A one-line ``ConfigError`` where ``config`` names a part no one registered."""
    for slot in SLOTS:
        if getattr(config, slot) not in _REGISTRY[slot]:
            raise ConfigError(f"model.{slot} = {getattr(config, slot)!r}: allowed values are "
                              f"{', '.join(names(slot))}")


def _origin(factory: Callable) -> str:
    return f"{factory.__module__}.{getattr(factory, '__qualname__', factory)}"


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
