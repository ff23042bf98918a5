"""A training step outside Lightning on a synthetic batch, as a run trains, and its timing in
each precision (``precision: auto`` chooses by it; ``plan.step_probe`` times a config's step with it)."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from reproduce.config import Config
from reproduce.paper.model import Transformer
from reproduce.paper.optim import adam_with_schedule, output_loss, padded_output_loss

CHOICES = ("32-true", "bf16-mixed")  # what ``precision: auto`` chooses between


def synthetic_batch(vocab: int, tokens: int, length: int, seed: int = 0
                    ) -> dict[str, torch.Tensor]:
    """Random sentences of ``length`` pieces filling ``tokens`` per side (for timing steps)."""
    g = torch.Generator().manual_seed(seed)
    B = max(1, tokens // length)
    src = torch.randint(4, vocab, (B, length), generator=g)
    tgt = torch.randint(4, vocab, (B, length + 1), generator=g)
    return {"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}


INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def user_compile_cache() -> str | None:
    """The kernel cache folder a user chose (``$TORCHINDUCTOR_CACHE_DIR``), or None where it is
    unset or torch's own default, which importing torch's compiler sets."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get(INDUCTOR_CACHE_ENV)
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        return None
    return current


def use_compile_cache() -> Path:
    """Where compiled kernels are kept between processes: ``$TORCHINDUCTOR_CACHE_DIR`` where a
    user set it, else ``inductor/`` in the project's cache (``reproduce.paths.cache_dir``), so a
    run resumed, a rank, a SLURM task requeued on another node and the next run of the same
    shapes load the graphs the first compiled (torch's own default, /tmp, is one node's; importing
    torch's compiler sets the variable to it, so that value counts as not set). On the 2-core Xeon
    a smoke run's fit took 119 s compiling into an empty cache, 52 s from a warm one (2026-11-29,
    ``table3 --variant base --scale smoke --set train.compile=on`` twice, beside a training run)."""
    from reproduce.paths import cache_dir

    if user_compile_cache() is None:
        os.environ[INDUCTOR_CACHE_ENV] = str(cache_dir() / "inductor")
    folder = Path(os.environ[INDUCTOR_CACHE_ENV])
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# The compiler's backend: inductor, unless this names another of torch's (``eager``: dynamo's
# capture alone, seconds where inductor's codegen takes a CPU minutes): for rehearsing the
# compiled paths on a CPU (benchmarks/gpu_window.py --compile-backend), never for a record
# that claims speed; a run's record names a backend other than inductor
COMPILE_BACKEND_ENV = "REPRODUCE_COMPILE_BACKEND"


def compile_backend() -> str:
    """The backend ``torch.compile`` is given here (``COMPILE_BACKEND_ENV``, default inductor)."""
    return os.environ.get(COMPILE_BACKEND_ENV) or "inductor"


def compile_with_backend(fn: Callable, **kwargs) -> Callable:
    """``torch.compile(fn, **kwargs)`` with ``compile_backend()``; inductor's ``options`` go to
    inductor only."""
    backend = compile_backend()
    if backend != "inductor":
        kwargs.pop("options", None)
    return torch.compile(fn, backend=backend, **kwargs)


def compiled_fast(loss_fn: Callable, cuda_graphs: bool = False) -> Callable:
    """``loss_fn`` (the fast path's training loss, ``lit.TranslationModule._padded_losses``)
    under ``torch.compile`` whole (``fullgraph``: nothing in it may fall back to Python between
    kernels), with dynamic shapes from the first call (token-count batches change shape every
    step: static graphs would compile once more per new shape), none of them taken equal to
    another because they were on the first batch (duck sizing: a batch with as many source as
    target positions would compile again at the next), and the modules' floats (dropout's p,
    layer norm's eps) constants, not symbols: dynamo would specialize each and trace the whole
    graph a second time (``TensorifyScalarRestartAnalysis``), twice the compile. Dropout draws
    its masks from torch's own generator, as eager does (inductor's ``fallback_random``), so the
    masks follow the seed each step is given (``lit.TranslationModule.on_train_batch_start``): a
    resumed run draws the uninterrupted run's, and the losses are eager's (``tests/golden``).
    ``cuda_graphs`` (``train.cuda_graphs``): on a GPU, each shape's graph is recorded once as a
    CUDA graph and replayed (inductor's cudagraph trees), the start of each call marked as a new
    step (a step's micro-batches call it more than once before the optimizer runs); a CPU's graphs
    are not affected. Outputs are only valid until the next call: callers keep copies."""
    from torch._dynamo import config as dynamo
    from torch.fx.experimental import _config as shapes

    use_compile_cache()
    compiled = compile_with_backend(
        loss_fn, dynamic=True, fullgraph=True,
        options={"fallback_random": True, "triton.cudagraphs": cuda_graphs})

    def run(*args, **kwargs):
        if cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with shapes.patch(use_duck_shape=False), dynamo.patch(specialize_float=True):
            return compiled(*args, **kwargs)
    return run


def compile_stats() -> dict[str, float]:
    """Graphs dynamo captured, the seconds compiling took (dynamo's count: capture and compile
    of every frame, backward graphs included), recompilations, and the graphs the compile cache
    (``use_compile_cache``) served and missed (inductor's graphs: a training graph's forward and
    its backward count one each, whichever cache layer found them), in this process since its
    counters were last cleared."""
    from torch._dynamo.utils import calculate_time_spent, counters

    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "seconds": round(calculate_time_spent().get("total_wall_time", 0.0), 1),
            "recompiles": sum(counters["recompiles"].values()),
            "cache_hits": int(counters["inductor"]["fxgraph_cache_hit"]),
            "cache_misses": int(counters["inductor"]["fxgraph_cache_miss"])}


def step_loss(model: Transformer, batch: dict[str, torch.Tensor], eps_ls: float,
              pad_id: int) -> torch.Tensor:
    """A batch's smoothed loss sum, as a run computes it (the model's features, then the tied
    output projection and the loss of ``optim.output_loss``): what ``torch.compile`` may wrap."""
    hidden = model.features(batch["src"], batch["tgt_in"])
    return output_loss(hidden, model.embed.weight, batch["tgt_out"], eps_ls, pad_id)[0]


def fast_losses(model: Transformer, batch: dict[str, torch.Tensor], eps_ls: float, pad_id: int,
                most_positions: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fast path's training loss (``train.compile``): the smoothed loss and NLL sums and the
    real target tokens, as tensors, with the projections that read one input fused
    (``model.fused_linear``) and the loss over every position (``optim.padded_output_loss``, its
    chunks for batches of at most ``most_positions`` target positions): what ``compiled_fast``
    wraps, for training (``lit.TranslationModule``) and for timing (``padded_step_loss``)."""
    hidden = model.features(batch["src"], batch["tgt_in"], fused=True)
    return padded_output_loss(hidden, model.embed.weight, batch["tgt_out"], eps_ls, pad_id,
                              most_positions=most_positions)


def padded_step_loss(model: Transformer, batch: dict[str, torch.Tensor], eps_ls: float,
                     pad_id: int, most_positions: int = 0) -> torch.Tensor:
    """``step_loss`` as the fast path computes it (``fast_losses``'s smoothed sum)."""
    return fast_losses(model, batch, eps_ls, pad_id, most_positions)[0]


def fast_step_loss(micro: Config | int) -> Callable:
    """The fast path's step loss, compiled, for micro-batches of ``micro`` tokens per side (or of
    a config's, on one device)."""
    tokens = micro if isinstance(micro, int) else micro.train.split_batch(1)[1]
    return compiled_fast(functools.partial(padded_step_loss, most_positions=tokens))


def train_step(model: torch.nn.Module, optimizer, schedule, batch: dict[str, torch.Tensor],
               config: Config, precision: str, accumulate: int = 1, loss_fn=step_loss) -> None:
    """One optimizer step outside Lightning, as a run trains: ``accumulate`` forward and backward
    passes of ``batch`` (``loss_fn``, by default ``step_loss``, under bf16 autocast for
    bf16-mixed), then Adam and the schedule."""
    device = batch["src"].device.type
    for _ in range(accumulate):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            loss = loss_fn(model, batch, config.train.eps_ls, config.model.pad_id)
        (loss / accumulate).backward()
    optimizer.step()
    schedule.step()
    optimizer.zero_grad(set_to_none=True)


def _timed(config: Config, tokens: int, contenders: dict[str, tuple[str, Callable]],
           rounds: int, length: int, device: str = "cpu", new_shapes: bool = False
           ) -> tuple[dict[str, float], dict[str, float]]:
    """(median seconds, warm-up seconds) of a training step of ``config``'s model on ``tokens``
    per side for each contender (its precision and loss function), on ``device``: one model,
    optimizer and synthetic batch, a warm-up step each, then ``rounds`` rounds interleaved, the
    order rotating. ``new_shapes``: each round on a batch of a shape not seen before (``length``
    and then ``shifted_lengths``), as a run's token-count batches come, so that whatever a new
    shape costs a contender (a recompile) is in its median."""
    torch.manual_seed(0)
    m, t = config.model, config.train
    model = Transformer(m).to(device).train()
    optimizer, schedule = adam_with_schedule(model.parameters(), t, m.d_model)
    lengths = [min(length, t.max_tokens_per_sentence)]
    if new_shapes:
        lengths += shifted_lengths(lengths[0], rounds)
    batches = [{k: v.to(device) for k, v in synthetic_batch(m.vocab_size, tokens, n).items()}
               for n in lengths]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step(name: str, batch: dict[str, torch.Tensor]) -> float:
        precision, loss_fn = contenders[name]
        sync()
        start = time.perf_counter()
        train_step(model, optimizer, schedule, batch, config, precision, loss_fn=loss_fn)
        sync()
        return time.perf_counter() - start

    order = list(contenders)
    first = {name: step(name, batches[0]) for name in order}
    times: dict[str, list[float]] = {name: [] for name in order}
    for r in range(rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            times[name].append(step(name, batches[(r + 1) % len(batches)]))
    return {name: round(sorted(v)[len(v) // 2], 4) for name, v in times.items()}, first


def seconds_by_precision(config: Config, tokens: int, rounds: int = 3,
                         length: int = 32) -> dict[str, float]:
    """Median seconds of a training step (forward, smoothed loss, backward, Adam) of ``config``'s
    model on ``tokens`` per side, in each precision; after a warm-up step each, interleaved."""
    return _timed(config, tokens, {p: (p, step_loss) for p in CHOICES}, rounds, length)[0]


def shifted_lengths(length: int, count: int) -> list[int]:
    """``count`` sentence lengths near ``length``: ``length`` + 1, - 2, + 3, - 4, ...; up to 7 of
    them fall in 7 different classes modulo 8 and none in ``length``'s, so a guard on a kernel's
    alignment sees each one new too."""
    return [max(2, length + (i + 1) * (-1) ** i) for i in range(count)]


def seconds_compiled(config: Config, tokens: int, precision: str, device: str = "cpu",
                     rounds: int = 3, length: int = 32) -> dict[str, float]:
    """A training step of ``config``'s model on ``tokens`` per side in ``precision`` on
    ``device``, eager and on the fast path (``compiled_fast(padded_step_loss)``; median seconds,
    interleaved after a warm-up step each, every timed round on a batch shape new to both, as a
    run's batches are), and the seconds compiling took (the compiled warm-up step less an eager
    one). Raises what ``torch.compile`` raises where it fails."""
    fast = fast_step_loss(tokens)
    medians, first = _timed(config, tokens, {"eager": (precision, step_loss),
                                             "compiled": (precision, fast)},
                            rounds, length, device, new_shapes=True)
    return {**medians,
            "compile_seconds": round(max(0.0, first["compiled"] - first["eager"]), 1)}
