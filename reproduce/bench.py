"""Performance side by side: our training step and decoding against the alternatives a user would
otherwise pick, in one process, on the same batches (``python -m reproduce bench``).

Training (forward, label-smoothed loss, backward, Adam step and warm-up schedule), in target tokens
per second and as a fraction of this machine's matmul peak, measured here per precision (model
FLOPs: ``reproduce.flops``, the same count for every contender since they compute the same function):

* ``ours``: ``reproduce.model.Transformer`` with the loss of ``lit.py`` (``optim.output_loss``);
* ``ours, Lightning loop``: the same module driven by a ``Trainer``, as runs train (the loop's own
  cost: hooks, logging, the optimizer call; trainer set-up excluded);
* ``torch.nn.Transformer`` and ``MarianMT`` (``reproduce.peers``), with
  ``F.cross_entropy(label_smoothing=...)``, the same Adam and schedule, our weights copied in;
* ``ours, torch.compile`` with ``--compile``.

Decoding, in sentences per second: our greedy and beam search with and without the key/value cache
(their outputs must be identical, or the command fails) and MarianMT ``generate`` with the same
beam, alpha and maximum length (see ``peers.marian_generate_kwargs`` for what differs).

Noise: contenders run after a warm-up, interleaved: every round runs each contender once, the order
rotating from round to round, so a background load hits all alike. Medians over rounds are
reported, with ratios to ours; the load average before the run is recorded and a run on a loaded
machine is marked as contended.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import logging
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import Config
from .decoding import beam_search, greedy_search
from .errors import ConfigError
from .flops import analytic_flops
from .logs import quiet_libraries
from .machine import cpu_flags, cpu_name
from .optim import adam_with_schedule
from .peers import (
    TorchTransformer,
    copy_into_marian,
    copy_into_torch,
    marian,
    marian_generate,
    marian_logits,
    smoothed_cross_entropy,
    trainable_parameters,
)

PAD, BOS, EOS = 0, 2, 3  # the tokenizer's ids (reproduce.tokenizer)
OURS = "ours"
BIBLE_VOCAB = 8000  # the `cpu` scale's cached Bible BPE; its ids are valid in any larger vocabulary


@dataclass(frozen=True)
class Plan:
    """How much to measure at one scale."""

    batch_tokens: int | None  # tokens per training batch; None: the scale's own
    batches: int  # training batches per round (the same ones for every contender)
    rounds: int
    sentences: int  # decoded per round; 0: no decoding
    length: int  # source length of synthetic sentences (untrained weights)
    decode_rounds: int


PLANS = {  # (scale, quick) -> plan; the paper's sizes are slow on a CPU: small batches, few repeats
    ("cpu", False): Plan(None, 4, 5, 48, 20, 3),
    ("cpu", True): Plan(None, 2, 3, 8, 10, 2),
    ("paper", False): Plan(1024, 2, 3, 8, 10, 2),
    ("paper", True): Plan(512, 1, 2, 0, 0, 0),
}
OTHER = {False: Plan(None, 3, 3, 8, 8, 2), True: Plan(None, 2, 2, 4, 6, 1)}


# --- the machine ---------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """CPU model, cores, the instruction sets that decide matmul speed, library versions."""
    try:
        import transformers
        hf = transformers.__version__
    except ImportError:
        hf = None
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "flags": cpu_flags(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": hf,
            "python": platform.python_version(), "load_average": os.getloadavg()}


def matmul_peak(dtype: torch.dtype, n: int, seconds: float = 0.5) -> float:
    """Best matmul rate in GFLOP/s over repeats of an n x n product, for about `seconds`."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    best, spent = 0.0, 0.0
    for _ in range(50):
        start = time.perf_counter()
        a @ b
        took = time.perf_counter() - start
        best, spent = max(best, 2 * n ** 3 / took / 1e9), spent + took
        if spent > seconds:
            break
    return best


# --- batches -------------------------------------------------------------------------------------


def _real_tokens(batch: dict[str, torch.Tensor]) -> int:
    return int((batch["tgt_out"] != PAD).sum())


def synthetic_batches(vocab: int, batch_tokens: int, count: int, max_len: int,
                      seed: int) -> list[dict[str, torch.Tensor]]:
    """Token-count batches (``data.batch_by_tokens``) of random ids with sentence-like lengths:
    sources log-normal around 30 pieces, targets about 10% longer (as German is)."""
    from .data import batch_by_tokens

    rng = np.random.default_rng(seed)
    src = np.clip(np.rint(rng.lognormal(math.log(30), 0.5, 20000)), 1, max_len - 1)
    tgt = np.clip(np.rint(src * rng.lognormal(0.1, 0.2, src.size)), 1, max_len - 1)
    lengths = np.stack([src, tgt], axis=1).astype(np.int64) + 1  # + EOS / BOS
    gen = torch.Generator().manual_seed(seed)
    out = []
    for indices in batch_by_tokens(lengths, batch_tokens, shuffle=True, seed=seed)[:count]:
        (S, T), B = lengths[indices].max(axis=0), len(indices)
        src_t = torch.randint(4, vocab, (B, S), generator=gen)
        tgt_t = torch.randint(4, vocab, (B, T + 1), generator=gen)
        for row, (s, t) in enumerate(lengths[indices]):
            src_t[row, s - 1], src_t[row, s:] = EOS, PAD
            tgt_t[row, t], tgt_t[row, t + 1:] = EOS, PAD  # BOS + t - 1 pieces + EOS
        tgt_t[:, 0] = BOS
        out.append({"src": src_t, "tgt_in": tgt_t[:, :-1], "tgt_out": tgt_t[:, 1:]})
    return out


class Bible:
    """Bible EN-DE, encoded once with the cached BPE of the `cpu` scale (the real length mix)."""

    def __init__(self, vocab: int, max_tokens_per_sentence: int, seed: int):
        from .data import TranslationData, load_pairs
        from .tokenizer import cache_dir, train_tokenizer

        pairs = load_pairs("bible-en-de", "train")
        self.tokenizer = train_tokenizer("bible-en-de", vocab, (s for p in pairs for s in p),
                                         cache_dir())
        self.data = TranslationData("bible-en-de", self.tokenizer, 4096, max_tokens_per_sentence,
                                    seed=seed)
        self.data.setup()

    def batches(self, batch_tokens: int, count: int) -> tuple[list[dict[str, torch.Tensor]], float]:
        """The first `count` shuffled training batches, and the seconds data.py took per batch."""
        self.data.batch_tokens = batch_tokens
        loader = iter(self.data.train_dataloader())
        next(loader)  # plans the epoch
        start = time.perf_counter()
        batches = list(itertools.islice(loader, count))
        return batches, (time.perf_counter() - start) / len(batches)

    def sources(self, count: int, batch_tokens: int, seed: int) -> list[torch.Tensor]:
        """`count` dev sentences, drawn at random, batched by length as evaluation batches them."""
        pairs = self.data.dev_pairs
        pick = np.random.default_rng(seed).choice(len(pairs), min(count, len(pairs)), replace=False)
        texts = [pairs[i][0] for i in sorted(pick)]
        return [src for _, src in self.data.source_batches(texts, batch_tokens)]


# --- timing --------------------------------------------------------------------------------------


def interleaved(contenders: dict[str, Callable[[], float | None]], rounds: int,
                warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per round of each contender. A contender returns None (its wall time is used) or
    the seconds it measured itself. Round r starts at contender r (mod count): the order rotates."""
    names = list(contenders)
    for _ in range(warmup):
        for name in names:
            contenders[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            own = contenders[name]()
            times[name].append(own if own is not None else time.perf_counter() - start)
    return times


@contextlib.contextmanager
def _precision(precision: str):
    if precision == "bf16-mixed":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yield
    else:
        yield


def _plain_step(model: torch.nn.Module, loss: Callable, config: Config, precision: str):
    """One training step per batch: forward, loss / tokens, backward, Adam, schedule."""
    optimizer, schedule = adam_with_schedule(
        [p for p in model.parameters() if p.requires_grad], config.train, config.model.d_model)

    def run(batches: list[dict[str, torch.Tensor]]) -> None:
        model.train()
        for batch in batches:
            with _precision(precision):
                total, n = loss(batch)
            (total / n).backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
    return run


def _lightning_loop(module, precision: str):
    """The module trained by a Lightning ``Trainer`` over the batches; the loop's seconds."""
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader

    class Clock(pl.Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            self.start = time.perf_counter()

        def on_train_end(self, trainer, pl_module) -> None:
            self.seconds = time.perf_counter() - self.start

    def run(batches: list[dict[str, torch.Tensor]]) -> float:
        clock = Clock()
        trainer = pl.Trainer(max_steps=len(batches), max_epochs=1, accelerator="cpu", devices=1,
                             precision=precision, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             num_sanity_val_steps=0, limit_val_batches=0, callbacks=[clock])
        trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None))
        return clock.seconds
    return run


@dataclass
class Result:
    name: str
    params: int
    seconds: list[float]
    work: float  # per round: target tokens (training) or sentences (decoding)
    flops: float = 0.0  # per round, training only
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.work / statistics.median(self.seconds)


# --- training ------------------------------------------------------------------------------------


def _compile_stats() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "recompiles": sum(counters["recompiles"].values())}


def bench_training(config: Config, batches: list[dict[str, torch.Tensor]], plan: Plan,
                   precision: str, use_compile: bool, lightning: bool,
                   ) -> tuple[list[Result], dict[str, float]]:
    """Training throughput of every contender on the same batches, and each one's loss on the
    first batch (eval mode, same weights): the same function gives the same number."""
    from .lit import TranslationModule

    c = config.model
    torch.manual_seed(config.train.seed)
    module = TranslationModule(config.to_dict())

    def our_loss(m):
        def loss(batch):
            smoothed, _, n = m._losses(batch)
            return smoothed, n
        return loss

    def peer_loss(forward):
        def loss(batch):
            logits = forward(batch)
            return (smoothed_cross_entropy(logits, batch["tgt_out"], config.train.eps_ls, c.pad_id),
                    (batch["tgt_out"] != c.pad_id).sum())
        return loss

    models: dict[str, tuple[torch.nn.Module, Callable]] = {OURS: (module.model, our_loss(module))}
    if lightning:
        models["ours, Lightning loop"] = (module.model, None)
    if use_compile:  # nn.Module.compile keeps the state_dict's keys (checkpoints load unchanged)
        compiled = TranslationModule(config.to_dict())
        compiled.model.load_state_dict(module.model.state_dict())
        compiled.model.compile()
        models["ours, torch.compile"] = (compiled.model, our_loss(compiled))
    torch_nn = TorchTransformer(c)
    copy_into_torch(module.model, torch_nn)
    models["torch.nn.Transformer"] = (torch_nn, peer_loss(lambda b: torch_nn(b["src"], b["tgt_in"])))
    try:
        mt = marian(c, BOS, EOS)
        copy_into_marian(module.model, mt)
        models["MarianMT (transformers)"] = (
            mt, peer_loss(lambda b: marian_logits(mt, b["src"], b["tgt_in"], c.pad_id)))
    except ImportError:
        pass

    first_loss = {}
    with torch.no_grad():
        for name, (model, loss) in models.items():
            if loss is not None and "compile" not in name:
                model.eval()
                total, n = loss(batches[0])
                first_loss[name] = float(total / n)

    runs = {name: (_lightning_loop(module, precision) if loss is None
                   else _plain_step(model, loss, config, precision))
            for name, (model, loss) in models.items()}
    compile_seconds, stats = 0.0, {}
    if use_compile:
        start = time.perf_counter()
        runs["ours, torch.compile"](batches)  # compiles for the shapes it sees
        compile_seconds = time.perf_counter() - start
        stats = _compile_stats()
    times = interleaved({name: (lambda run=run: run(batches)) for name, run in runs.items()},
                        plan.rounds)
    tokens = sum(_real_tokens(b) for b in batches)
    flops = sum(analytic_flops(c, b["src"].numel(), b["tgt_in"].numel(),
                               b["src"].shape[0] * b["src"].shape[1] ** 2,
                               b["tgt_in"].shape[0] * b["tgt_in"].shape[1] ** 2,
                               b["src"].shape[0] * b["src"].shape[1] * b["tgt_in"].shape[1])
                for b in batches)
    results = []
    for name, (model, _) in models.items():
        r = Result(name, trainable_parameters(model), times[name], tokens, flops)
        if name == "ours, torch.compile":
            after = _compile_stats()
            r.note = (f"first pass {compile_seconds:.0f} s (compiling); {stats['graphs']} graphs; "
                      f"{after['recompiles'] - stats['recompiles']} recompiles while measured")
        results.append(r)
    return results, first_loss


# --- decoding ------------------------------------------------------------------------------------


def bench_decoding(model, sources: list[torch.Tensor], rounds: int, beam: int, alpha: float,
                   offset: int) -> tuple[list[Result], dict[str, Any]]:
    """Sentences per second of each search; cached and uncached outputs must be identical.

    Returns the results and the checks: cached == uncached per search, and the share of sentences
    where MarianMT's output equals ours (greedy; beam at our alpha; beam with alpha 0 on both)."""
    model.eval()
    c = model.config
    mt = None
    with contextlib.suppress(ImportError):
        mt = marian(c, BOS, EOS).eval()
        copy_into_marian(model, mt)

    def ours(search_beam: int, use_cache: bool, a: float = alpha):
        def run() -> list[list[int]]:
            out = []
            for src in sources:
                if search_beam == 1:
                    out += greedy_search(model, src, BOS, EOS, offset, use_cache=use_cache)
                else:
                    out += beam_search(model, src, BOS, EOS, beam=search_beam, alpha=a,
                                       max_len_offset=offset, use_cache=use_cache)
            return out
        return run

    def theirs(search_beam: int, a: float = alpha):
        def run() -> list[list[int]]:
            out = []
            for src in sources:
                out += marian_generate(mt, src, search_beam, a, offset, PAD, BOS, EOS)
            return out
        return run

    searches = {"greedy": 1, f"beam {beam}": beam}
    fns: dict[str, Callable[[], list[list[int]]]] = {}
    for search, k in searches.items():
        fns[f"{search} | ours, cached"] = ours(k, True)
        fns[f"{search} | ours, uncached"] = ours(k, False)
        if mt is not None:
            fns[f"{search} | MarianMT generate"] = theirs(k)
    outputs: dict[str, list[list[int]]] = {}

    def timed(name):
        def run() -> None:
            outputs[name] = fns[name]()
        return run

    times = interleaved({name: timed(name) for name in fns}, rounds, warmup=0 if rounds > 1 else 1)
    n = sum(src.shape[0] for src in sources)
    results = [Result(name, trainable_parameters(mt if "Marian" in name else model), times[name], n)
               for name in fns]
    checks: dict[str, Any] = {}
    for search in searches:
        checks[f"{search}: cached == uncached"] = (
            outputs[f"{search} | ours, cached"] == outputs[f"{search} | ours, uncached"])
        if mt is not None:
            same = sum(a == b for a, b in zip(outputs[f"{search} | ours, cached"],
                                              outputs[f"{search} | MarianMT generate"], strict=True))
            checks[f"{search}: MarianMT output equals ours"] = f"{same}/{n}"
    if mt is not None:
        a0, b0 = ours(beam, True, 0.0)(), theirs(beam, 0.0)()
        same = sum(a == b for a, b in zip(a0, b0, strict=True))
        checks[f"beam {beam}, alpha 0 on both: MarianMT output equals ours"] = f"{same}/{n}"
    lengths = [len(o) for o in outputs[f"beam {beam} | ours, cached"]]
    checks["mean output length (beam, ours)"] = round(statistics.mean(lengths), 1)
    return results, checks


# --- the report ----------------------------------------------------------------------------------


def _fmt(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def _spread(seconds: list[float], work: float) -> str:
    return f"{_fmt(work / max(seconds))}–{_fmt(work / min(seconds))}"


def render(info: dict[str, Any], sections: list[dict[str, Any]], command: str) -> str:
    """The Markdown report (results/performance.md)."""
    m = info["machine"]
    load = m["load_average"][0]
    contended = load >= 0.5
    lines = ["# Performance: our training step and decoding beside the alternatives", "",
             f"Written by `{command}` on {info['date']}; regenerate it, never edit it by hand.", ""]
    if contended:
        lines += [f"**Contended run**: the 1-minute load average was {load:.2f} on {m['cores']} "
                  "cores before the benchmark started (another job was running). Absolute rates "
                  "are low and noisy; the ratios, from interleaved rounds, are the numbers to "
                  "read. Rerun on an idle machine for absolute figures.", ""]
    flags = ", ".join(m["flags"]) or "none of avx2/fma/avx512*/amx*"
    missing = [f for f in ("avx512_bf16", "amx_bf16") if f not in m["flags"]]
    lines += ["## Machine", "", "| | |", "|---|---|",
              f"| CPU | {m['cpu']}, {m['cores']} cores |",
              f"| flags | {flags}{'; no ' + ', '.join(missing) if missing else ''} "
              f"(torch dispatches {m['torch_cpu_capability']}) |",
              f"| threads | {m['threads']} (torch.get_num_threads) |",
              f"| precision | {info['precision']} |",
              f"| versions | torch {m['torch']}, transformers {m['transformers'] or 'not installed'}, "
              f"Python {m['python']} |",
              f"| load average before | {', '.join(f'{x:.2f}' for x in m['load_average'])} |", "",
              f"Matmul peak measured here with the same {m['threads']} thread(s) (best of "
              "repeats of one n x n product, before and after the contenders):", "",
              "| dtype | n | GFLOP/s |", "|---|---:|---:|"]
    for dtype, (n, rate) in info["peaks"].items():
        lines.append(f"| {dtype} | {n} | {rate:.1f} |")
    peak = info["peaks"]["bfloat16" if info["precision"] == "bf16-mixed" else "float32"][1]
    for s in sections:
        c = s["config"].model
        lines += ["", f"## Scale `{s['scale']}`: N={c.N}, d_model={c.d_model}, d_ff={c.d_ff}, "
                  f"h={c.h}, d_k=d_v={c.d_k}, vocabulary {c.vocab_size}", ""]
        train = s["train"]
        ours = next(r for r in train if r.name == OURS)
        lines += [f"Training: {s['batches_about']}; interleaved rounds: {len(ours.seconds)}, after "
                  "one warm-up round; median target tokens per second (min–max over rounds). "
                  "Loss on the first batch in eval mode, same weights: ours "
                  f"{s['first_loss'][OURS]:.4f}, largest difference of a peer "
                  f"{max(abs(v - s['first_loss'][OURS]) for v in s['first_loss'].values()):.1e}.",
                  "",
                  "| contender | trainable params | target tokens/s | min–max | vs ours | "
                  "model GFLOP/s | of peak | note |", "|---|---:|---:|---:|---:|---:|---:|---|"]
        for r in train:
            gflops = r.flops / statistics.median(r.seconds) / 1e9
            lines.append(f"| {r.name} | {r.params:,} | {r.rate:.0f} | {_spread(r.seconds, r.work)} "
                         f"| {r.rate / ours.rate:.2f}x | {gflops:.1f} | {gflops / peak:.0%} | "
                         f"{r.note} |")
        others = [r for r in train if not r.name.startswith(OURS)]
        if others:
            best = max(others, key=lambda r: r.rate)
            lines += ["", f"Our step against the fastest peer ({best.name}): "
                      f"{ours.rate / best.rate:.2f}x."]
        if s.get("decode"):
            dec = s["decode"]
            lines += ["", f"Decoding: {s['decode_about']}; interleaved rounds: "
                      f"{len(dec[0].seconds)}; median sentences per second.", "",
                      "| search | contender | sentences/s | min–max | vs ours, cached |",
                      "|---|---|---:|---:|---:|"]
            for r in dec:
                search, who = r.name.split(" | ")
                base = next(x for x in dec if x.name == f"{search} | ours, cached")
                lines.append(f"| {search} | {who} | {_fmt(r.rate)} | {_spread(r.seconds, r.work)} "
                             f"| {r.rate / base.rate:.2f}x |")
            lines += ["", "Checks: " + "; ".join(f"{k}: {v}" for k, v in s["checks"].items()) + "."]
            rate = {r.name: r.rate for r in dec}
            for search in dict.fromkeys(r.name.split(" | ")[0] for r in dec):
                cached = rate[f"{search} | ours, cached"]
                line = (f"{search}: cached {cached / rate[f'{search} | ours, uncached']:.1f}x "
                        "uncached")
                if f"{search} | MarianMT generate" in rate:
                    line += f", {cached / rate[f'{search} | MarianMT generate']:.2f}x MarianMT"
                lines += ["", line + "."]
    lines += ["", "## Notes", "",
              "- Every contender computes the same function: the peers are built by "
              "`reproduce/peers.py` with our weights copied in (nn.Transformer without its final "
              "LayerNorms, which the paper lacks; Marian with our interleaved sinusoid table). "
              "The FLOP count (`reproduce/flops.py`: matmuls only, padded shapes, training = "
              "3 x forward) is the same for all, so `model GFLOP/s` is useful work.",
              "- Loss: ours is `optim.output_loss` (the tied output projection, one log-softmax, "
              "the smoothed loss and the unsmoothed NLL for perplexity, in chunks over the real "
              "target tokens, gradients written out); the peers project to logits and use "
              "`F.cross_entropy(label_smoothing)`, the same formula.",
              "- `ours, Lightning loop` is the time between the Trainer's `on_train_start` and "
              "`on_train_end` over the same batches: what a real run pays per step, with logging "
              "and hooks; the Trainer's set-up (a few tenths of a second per run) is left out.",
              "- MarianMT `generate` (HF `transformers`) is run with beam 4, `length_penalty` = "
              "alpha, `early_stopping=True` (stop once 4 hypotheses ended, as ours), EOS forced "
              "after input + 50 tokens, PAD/BOS suppressed. HF's length penalty divides by "
              "|Y|^alpha; ours (GNMT, as the paper's tensor2tensor) by ((5 + |Y|) / 6)^alpha, so "
              "beam outputs can differ at alpha 0.6; with alpha 0 on both they rank alike. HF "
              "limits length per batch, we per sentence.",
              "- Untrained weights almost never emit EOS, so outputs run to the maximum length "
              "(input + 50): the worst case for the uncached search, whose step cost grows with the "
              "prefix. With `--checkpoint` the `cpu` scale decodes Bible dev sentences with trained "
              "weights, at realistic lengths."]
    return "\n".join(lines) + "\n"


# --- the command ---------------------------------------------------------------------------------


def run(args: argparse.Namespace, command: str) -> int:
    """``python -m reproduce bench``: measure, print and write the report; 1 if a check failed."""
    from .precision import resolve_precision
    from .sweep import load_spec

    if args.checkpoint and not Path(args.checkpoint).is_file():
        raise ConfigError(f"--checkpoint {args.checkpoint}: no such file")
    quiet_libraries(logging.ERROR)
    if args.threads:
        torch.set_num_threads(args.threads)
    info: dict[str, Any] = {"machine": machine(),
                            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    peaks = {"float32": (1024, matmul_peak(torch.float32, 1024)),
             "bfloat16": (512, matmul_peak(torch.bfloat16, 512, seconds=0.3))}
    precision = resolve_precision(args.precision)
    info["precision"] = (f"{precision} (asked: {args.precision})" if args.precision != precision
                         else precision)
    spec = load_spec("table3")
    overrides = _overrides(args.set)
    sections, ok = [], True
    bible = None
    for scale in args.scales:
        config = spec.resolve("base", scale).overrides(**overrides)
        plan = PLANS.get((scale, args.quick), OTHER[args.quick])
        c = config.model
        batch_tokens = plan.batch_tokens or config.train.batch_tokens
        max_len = config.train.max_tokens_per_sentence
        if args.data == "bible" and c.vocab_size >= BIBLE_VOCAB:
            if bible is None:
                bible = Bible(BIBLE_VOCAB, 128, args.seed)
            batches, per_batch = bible.batches(batch_tokens, plan.batches)
            about = (f"Bible EN-DE training batch(es) (BPE {BIBLE_VOCAB}; data.py builds one in "
                     f"{per_batch * 1e3:.1f} ms)")
        else:
            batches = synthetic_batches(c.vocab_size, batch_tokens, plan.batches, max_len, args.seed)
            about = "synthetic batch(es) (random ids, log-normal lengths)"
        shapes = ", ".join(f"{b['src'].shape[0]}x{b['src'].shape[1]}->{b['tgt_in'].shape[1]}"
                           for b in batches)
        section: dict[str, Any] = {
            "scale": scale, "config": config,
            "batches_about": f"{len(batches)} {about}, each at most {batch_tokens} padded tokens "
                             f"(B x S -> T: {shapes}; {sum(map(_real_tokens, batches))} real "
                             "target tokens per round)"}
        print(f"[{scale}] training: {section['batches_about']}", flush=True)
        section["train"], section["first_loss"] = bench_training(
            config, batches, plan, precision, args.compile, not args.no_lightning)
        for r in section["train"]:
            print(f"  {r.name:28} {r.rate:9.0f} target tokens/s  {r.note}", flush=True)
        if plan.sentences:
            model, sources, about = _decoding_setup(args, scale, config, plan, bible)
            section["decode_about"] = about
            print(f"[{scale}] decoding: {about}", flush=True)
            section["decode"], section["checks"] = bench_decoding(
                model, sources, plan.decode_rounds, config.decode.beam, config.decode.alpha,
                config.decode.max_len_offset)
            for r in section["decode"]:
                print(f"  {r.name:36} {r.rate:8.2f} sentences/s", flush=True)
            print("  " + "; ".join(f"{k}: {v}" for k, v in section["checks"].items()), flush=True)
            ok &= all(v for k, v in section["checks"].items() if "cached == uncached" in k)
        sections.append(section)
    info["peaks"] = {k: (n, max(rate, matmul_peak(getattr(torch, k), n, 0.3)))  # again, at the end
                     for k, (n, rate) in peaks.items()}
    report = render(info, sections, command)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    raw = out.with_suffix(".json")  # every round's seconds, so the tables can be checked or redone
    raw.write_text(json.dumps({**info, "command": command, "sections": [
        {**sec, "config": sec["config"].to_dict(),
         "train": [dataclasses.asdict(r) for r in sec["train"]],
         "decode": [dataclasses.asdict(r) for r in sec.get("decode", [])]} for sec in sections]},
        indent=1) + "\n")
    print(f"wrote {out} and {raw}")
    return 0 if ok else 1


def _overrides(items: list[str]) -> dict[str, Any]:
    """``["N=2", "p_drop=0"]`` -> ``{"N": 2, "p_drop": 0}`` (values read as YAML scalars)."""
    import yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. N=2")
        out[key] = yaml.safe_load(value)
    return out


def _decoding_setup(args, scale: str, config: Config, plan: Plan, bible: Bible | None):
    """Weights and sources to decode: a trained checkpoint on Bible dev sentences, or untrained
    weights on random sources of `plan.length` tokens."""
    from .lit import TranslationModule
    from .model import Transformer

    if args.checkpoint and scale == "cpu":
        module = TranslationModule.load_from_checkpoint(args.checkpoint, map_location="cpu")
        if module.config.model != config.model:
            raise ValueError(f"{args.checkpoint}: a model of another size than scale {scale!r}'s "
                             f"base ({module.config.model} != {config.model})")
        bible = bible or Bible(BIBLE_VOCAB, 128, args.seed)
        sources = bible.sources(plan.sentences, config.train.batch_tokens, args.seed)
        return (module.model, sources,
                f"{plan.sentences} Bible dev sentences drawn at random, trained weights "
                f"({args.checkpoint}), batched as evaluation batches them")
    torch.manual_seed(args.seed)
    model = Transformer(config.model)
    gen = torch.Generator().manual_seed(args.seed)
    src = torch.randint(4, config.model.vocab_size, (plan.sentences, plan.length), generator=gen)
    return (model, [src], f"{plan.sentences} random sources of {plan.length} tokens in one batch, "
                          "untrained weights (every output runs to input + 50 tokens)")
