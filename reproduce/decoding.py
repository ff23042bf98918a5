"""Greedy and beam search (section 6.1), batched over sentences, incremental by default.

Beam search keeps `beam` hypotheses per sentence; a hypothesis that emits EOS is finished and scored
with the GNMT length penalty lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016), as tensor2tensor does.
Each sentence may produce at most (its input length + max_len_offset) tokens before EOS; a sentence
stops as soon as `beam` hypotheses have finished ("stop early when all beams end"), and the search
stops when every sentence has. With beam 1 this is exactly greedy search.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .model import Transformer

NEG_INF = float("-inf")


def length_penalty(length: Tensor | int, alpha: float) -> Tensor | float:
    """GNMT's lp(Y) = ((5 + |Y|) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


def _max_lengths(src: Tensor, pad_id: int, offset: int) -> Tensor:
    return (src != pad_id).sum(dim=1) + offset  # (B,) tokens allowed before EOS


def _strip(rows: Tensor, eos: int) -> list[list[int]]:
    out = []
    for row in rows.tolist():
        out.append(row[: row.index(eos)] if eos in row else row)
    return out


def _next_logp(model: Transformer, state, tokens: Tensor, bos: int) -> Tensor:
    """Log-probabilities of the next token; padding and BOS are never valid outputs."""
    logp = model.step(state, tokens)
    logp[:, [model.config.pad_id, bos]] = NEG_INF
    return logp


@torch.no_grad()
def greedy_search(model: Transformer, src: Tensor, bos: int, eos: int, max_len_offset: int = 50,
                  use_cache: bool = True) -> list[list[int]]:
    """Arg-max decoding of a batch of sources (B, S); returns token ids without BOS/EOS."""
    B, device = src.shape[0], src.device
    max_len = _max_lengths(src, model.config.pad_id, max_len_offset)
    steps = int(max_len.max()) + 1
    state = model.start_decoding(src, beam=1, max_len=steps, use_cache=use_cache)
    tokens = torch.full((B,), bos, dtype=torch.long, device=device)
    out = torch.full((B, steps), eos, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    for t in range(steps):
        logp = _next_logp(model, state, tokens, bos)
        nxt = logp.argmax(dim=-1)
        nxt = torch.where((t >= max_len) | done, torch.full_like(nxt, eos), nxt)
        out[:, t] = nxt
        done |= nxt == eos
        if bool(done.all()):
            break
        tokens = nxt
    return _strip(out, eos)


@torch.no_grad()
def beam_search(model: Transformer, src: Tensor, bos: int, eos: int, beam: int = 4,
                alpha: float = 0.6, max_len_offset: int = 50,
                use_cache: bool = True) -> list[list[int]]:
    """Beam search over a batch of sources (B, S); returns the best hypothesis per sentence."""
    B, K, device = src.shape[0], beam, src.device
    max_len = _max_lengths(src, model.config.pad_id, max_len_offset).repeat_interleave(K)
    steps = int(max_len.max()) + 1
    state = model.start_decoding(src, beam=K, max_len=steps, use_cache=use_cache)

    hist = torch.full((B * K, steps + 1), eos, dtype=torch.long, device=device)
    hist[:, 0] = bos
    scores = torch.zeros(B, K, device=device)
    scores[:, 1:] = NEG_INF  # all beams start identical: expand only the first
    fin_scores = torch.full((B, K), NEG_INF, device=device)
    fin_hist = torch.full((B, K, steps + 1), eos, dtype=torch.long, device=device)
    fin_count = torch.zeros(B, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    base = torch.arange(B, device=device)[:, None] * K  # (B, 1) first row of each sentence

    for t in range(steps):
        logp = _next_logp(model, state, hist[:, t], bos)  # (B*K, V)
        V = logp.shape[1]
        at_limit = t >= max_len  # only EOS may follow
        if bool(at_limit.any()):
            eos_col = logp[:, eos].clone()
            logp[at_limit] = NEG_INF
            logp[:, eos] = eos_col
        cand = (scores.view(B * K, 1) + logp).view(B, K * V)
        top_s, top_i = cand.topk(2 * K, dim=1)  # 2K so that K survive even if K end in EOS
        top_beam, top_tok = top_i // V, top_i % V

        # Hypotheses ending now, among the K best candidates, join the finished set.
        ends = (top_tok[:, :K] == eos) & (top_s[:, :K] > NEG_INF) & ~done[:, None]
        if bool(ends.any()):
            new_s = torch.where(ends, top_s[:, :K] / length_penalty(t + 1, alpha), NEG_INF)
            new_h = hist[(base + top_beam[:, :K]).view(-1)].view(B, K, -1).clone()
            new_h[:, :, t + 1] = eos
            all_s = torch.cat([fin_scores, new_s], dim=1)
            all_h = torch.cat([fin_hist, new_h], dim=1)
            fin_scores, keep = all_s.topk(K, dim=1)
            fin_hist = all_h.gather(1, keep[:, :, None].expand(-1, -1, all_h.shape[2]))
            fin_count += ends.sum(dim=1)
            done |= fin_count >= K
            if bool(done.all()):
                break

        # The K best candidates that did not end carry on.
        alive_s = torch.where(top_tok == eos, NEG_INF, top_s)
        scores, pick = alive_s.topk(K, dim=1)
        rows = (base + top_beam.gather(1, pick)).view(-1)
        hist = hist[rows]
        hist[:, t + 1] = top_tok.gather(1, pick).view(-1)
        state.reorder(rows)

    best = fin_scores.argmax(dim=1)
    return _strip(fin_hist[torch.arange(B, device=device), best, 1:], eos)
