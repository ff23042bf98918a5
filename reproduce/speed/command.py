"""``python -m reproduce bench``: build the contenders for each scale, time them, write the report."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from reproduce.config import Config, parse_sets
from reproduce.errors import ConfigError
from reproduce.paper.model import Transformer
from reproduce.paths import runs_dir
from reproduce.records.sweep import load_spec
from reproduce.speed.decoding_peers import bench_decoding
from reproduce.speed.inputs import BIBLE_VOCAB, OTHER, PLANS, Bible, Plan, real_tokens, synthetic_batches
from reproduce.speed.report import environment, performance_page
from reproduce.speed.training import bench_training
from reproduce.train import timings
from reproduce.train.lit import TranslationModule
from reproduce.train.precision import bf16_matmul_not_slower, choose
from reproduce.util.logs import quiet_libraries
from reproduce.util.machine import matmul_gflops


def run(args: argparse.Namespace, command: str) -> int:
    """``python -m reproduce bench``: measure, print and write the report; 1 if a check failed."""
    if args.checkpoint and not Path(args.checkpoint).is_file():
        raise ConfigError(f"--checkpoint {args.checkpoint}: no such file")
    quiet_libraries(logging.ERROR)
    if args.threads:
        torch.set_num_threads(args.threads)
    info: dict[str, Any] = {"machine": environment(),
                            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    peaks = {"float32": (1024, matmul_gflops(torch.float32, 1024)),
             "bfloat16": (512, matmul_gflops(torch.bfloat16, 512, budget=0.3))}
    precisions = _precisions(args.precision)
    info["precision"] = (
        ", ".join(precisions) + " side by side" + (
            "" if len(precisions) > 1 or args.precision != "auto" else
            " (bf16 matmuls are slower than fp32 here: no native bf16, so bf16-mixed is not "
            "measured, and runs train in fp32 without timing it)"))
    spec = load_spec("table3")
    overrides = parse_sets(args.set)
    sections, ok = [], True
    bible = None
    for scale in dict.fromkeys(args.scales or ["cpu", "paper"]):  # each once, in order
        config = spec.resolve("base", scale).overrides(**overrides)
        plan = PLANS.get((scale, args.quick), OTHER[args.quick])
        c = config.model
        batch_tokens = plan.batch_tokens or config.train.batch_tokens
        max_len = config.train.max_tokens_per_sentence
        if args.data == "bible" and c.vocab_size >= BIBLE_VOCAB:
            if bible is None:
                bible = Bible(BIBLE_VOCAB, 128, args.seed)
            batches, per_batch = bible.batches(batch_tokens, plan.batches)
            about = (f"Bible EN-DE training batch(es) (BPE {BIBLE_VOCAB}; the data module builds one in "
                     f"{per_batch * 1e3:.1f} ms)")
        else:
            batches = synthetic_batches(c.vocab_size, batch_tokens, plan.batches, max_len, args.seed)
            about = "synthetic batch(es) (random ids, log-normal lengths)"
        shapes = ", ".join(f"{b['src'].shape[0]}x{b['src'].shape[1]}->{b['tgt_in'].shape[1]}"
                           for b in batches)
        section: dict[str, Any] = {
            "scale": scale, "config": config,
            "batches_about": f"{len(batches)} {about}, each at most {batch_tokens} padded tokens "
                             f"(B x S -> T: {shapes}; {sum(map(real_tokens, batches))} real "
                             "target tokens per round)"}
        print(f"[{scale}] training: {section['batches_about']}", flush=True)
        section["runs_take"] = _runs_take(config)
        print(f"  runs at `{scale}` train in {section['runs_take']}", flush=True)
        section["train"], section["first_loss"] = bench_training(
            config, batches, plan, precisions, args.compile, not args.no_lightning)
        for r in section["train"]:
            print(f"  {r.name:28} {r.precision:10} {r.rate:9.0f} target tokens/s  {r.note}",
                  flush=True)
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
    info["peaks"] = {k: (n, max(rate, matmul_gflops(getattr(torch, k), n, 0.3)))  # again, at the end
                     for k, (n, rate) in peaks.items()}
    report = performance_page(info, sections, command)
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


def _precisions(asked: str) -> list[str]:
    """What the training contenders run in: ``auto``, fp32 and bf16-mixed side by side where
    bf16 is native (the screen a run uses before it times a step), else fp32 alone."""
    if asked in ("32-true", "bf16-mixed"):
        return [asked]
    if asked != "auto":
        raise ConfigError(f"--precision {asked}: one of auto, 32-true, bf16-mixed")
    if torch.cuda.is_available() or bf16_matmul_not_slower():
        return ["32-true", "bf16-mixed"]
    return ["32-true"]


def _runs_take(config: Config) -> str:
    """The precision a run of ``config`` trains in on this machine, and how it was decided:
    ``precision.choose``, the timed step runs use (cached in runs/timings.json), never a matmul."""
    micro = config.train.split_batch(1)[1]
    chosen, how = choose(config, micro, runs_dir() / timings.TIMINGS,
                         model="table3's base at this scale")
    seconds = how.get("seconds_per_step") or {}
    timed = ", ".join(f"{p} {t:.3f} s/step" for p, t in seconds.items())
    return (f"{chosen}: {how['how']}" + (f" ({timed})" if timed else "")
            + (", cached from an earlier measurement" if how.get("cached") else ""))


def _decoding_setup(args, scale: str, config: Config, plan: Plan, bible: Bible | None):
    """Weights and sources to decode: a trained checkpoint on Bible dev sentences, or untrained
    weights on random sources of `plan.length` tokens."""
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
