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

from reproduce.paper.model import Transformer

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
                  use_cache: bool = True, constraint: TreeConstraint | None = None) -> list[list[int]]:
    """Arg-max decoding of a batch of sources (B, S); returns token ids without BOS/EOS."""
    B, device = src.shape[0], src.device
    max_len = _max_lengths(src, model.config.pad_id, max_len_offset)
    steps = int(max_len.max()) + 1
    state = model.start_decoding(src, beam=1, use_cache=use_cache)
    tokens = torch.full((B,), bos, dtype=torch.long, device=device)
    out = torch.full((B, steps), eos, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    if constraint is not None:
        constraint.begin(1, max_len)
    for t in range(steps):
        logp = _next_logp(model, state, tokens, bos)
        if constraint is not None:
            logp = constraint.rescore(logp).masked_fill(~constraint.allowed(t), NEG_INF)
        nxt = logp.argmax(dim=-1)
        nxt = torch.where((t >= max_len) | done, torch.full_like(nxt, eos), nxt)
        if constraint is not None:
            constraint.update(torch.arange(B, device=device), nxt)
        out[:, t] = nxt
        done |= nxt == eos
        if bool(done.all()):
            break
        tokens = nxt
    return _strip(out, eos)


@torch.no_grad()
def beam_search(model: Transformer, src: Tensor, bos: int, eos: int, beam: int = 4,
                alpha: float = 0.6, max_len_offset: int = 50, use_cache: bool = True,
                constraint: TreeConstraint | None = None) -> list[list[int]]:
    """Beam search over a batch of sources (B, S); returns the best hypothesis per sentence.
    ``constraint`` (started on this batch) restricts every step to the tokens it allows."""
    B, K, device = src.shape[0], beam, src.device
    max_len = _max_lengths(src, model.config.pad_id, max_len_offset).repeat_interleave(K)
    steps = int(max_len.max()) + 1
    state = model.start_decoding(src, beam=K, use_cache=use_cache)

    # Per sentence still searching (B shrinks as sentences finish; `ids` are their batch indices):
    hist = torch.full((B * K, steps + 1), eos, dtype=torch.long, device=device)
    hist[:, 0] = bos
    scores = torch.zeros(B, K, device=device)
    scores[:, 1:] = NEG_INF  # all beams start identical: expand only the first
    ids = torch.arange(B, device=device)
    # Per sentence of the batch: the K best finished hypotheses.
    fin_scores = torch.full((B, K), NEG_INF, device=device)
    fin_hist = torch.full((B, K, steps + 1), eos, dtype=torch.long, device=device)
    fin_count = torch.zeros(B, dtype=torch.long, device=device)
    if constraint is not None:
        constraint.begin(K, max_len)

    for t in range(steps):
        logp = _next_logp(model, state, hist[:, t], bos)  # (B*K, V)
        V = logp.shape[1]
        eos_raw = logp[:, eos]  # the model's, before any constraint: at the limit EOS must stay
        if constraint is not None:
            logp = constraint.rescore(logp).masked_fill(~constraint.allowed(t), NEG_INF)
        at_limit = t >= max_len  # only EOS may follow (constrained or not)
        if bool(at_limit.any()):
            eos_col = torch.where(at_limit, eos_raw, logp[:, eos])
            logp[at_limit] = NEG_INF
            logp[:, eos] = eos_col
        cand = (scores.view(B * K, 1) + logp).view(B, K * V)
        top_s, top_i = cand.topk(2 * K, dim=1)  # 2K so that K survive even if K end in EOS
        top_beam, top_tok = top_i // V, top_i % V
        base = torch.arange(B, device=device)[:, None] * K  # (B, 1) first row of each sentence

        # Hypotheses ending now, among the K best candidates, join the finished set.
        ends = (top_tok[:, :K] == eos) & (top_s[:, :K] > NEG_INF)
        keep = None
        if bool(ends.any()):
            new_s = torch.where(ends, top_s[:, :K] / length_penalty(t + 1, alpha), NEG_INF)
            new_h = hist[(base + top_beam[:, :K]).view(-1)].view(B, K, -1).clone()
            new_h[:, :, t + 1] = eos
            all_s = torch.cat([fin_scores[ids], new_s], dim=1)
            all_h = torch.cat([fin_hist[ids], new_h], dim=1)
            best_s, best = all_s.topk(K, dim=1)
            fin_scores[ids] = best_s
            fin_hist[ids] = all_h.gather(1, best[:, :, None].expand(-1, -1, all_h.shape[2]))
            fin_count[ids] += ends.sum(dim=1)
            done = fin_count[ids] >= K
            if bool(done.all()):
                break
            if bool(done.any()):  # finished sentences leave the batch
                keep = (~done).nonzero().squeeze(1)

        # The K best candidates that did not end carry on.
        alive_s = torch.where(top_tok == eos, NEG_INF, top_s)
        scores, pick = alive_s.topk(K, dim=1)
        rows = base + top_beam.gather(1, pick)  # (B, K) rows of this step
        tokens = top_tok.gather(1, pick)
        if keep is not None:
            rows, tokens, scores, ids = rows[keep], tokens[keep], scores[keep], ids[keep]
            B = keep.shape[0]
        rows, tokens = rows.view(-1), tokens.view(-1)
        hist = hist[rows]
        hist[:, t + 1] = tokens
        max_len = max_len[rows]
        state.reorder(rows, keep)
        if constraint is not None:
            constraint.update(rows, tokens)

    best = fin_scores.argmax(dim=1)
    return _strip(fin_hist[torch.arange(fin_scores.shape[0], device=device), best, 1:], eos)


class TreeConstraint:
    """Constrained decoding for parse trees (Table 4; ``decode.constrained``, off in the paper's
    protocol): at every step only tokens that keep the output a well-formed tree over exactly the
    input's words are allowed. ``(LABEL`` opens a constituent (one root; none after it closes, none
    when no word is left to fill it), a word slot (``parsing.is_word_slot``) needs an open
    constituent and a word left, ``)LABEL`` must match the innermost open label and close a
    constituent holding a word (the root only once every word has a slot), EOS only follows the
    closed root. Hypotheses are scored by the model as usual; the constraint removes the rest.

    With ``copy`` (the ``words`` linearization, ``start(words, src)``) a word is written as the
    source's own pieces: at a word boundary the only word token allowed is the source's next piece,
    inside a word only its next piece, and brackets only between words. The model's choice there is
    between a bracket and *a* word, so the next piece is scored with the probability of all word
    tokens together (``rescore``): a model unsure which word comes next does not open brackets
    instead, again and again.

    Vectorized over rows (sentences x beams): per row the slots used (words, or pieces with
    ``copy``), the open labels as a stack and whether each open constituent holds a word yet.
    """

    def __init__(self, pieces: list[str], model_vocab: int, eos: int, max_depth: int = 64):
        from reproduce.paper.parsing import is_word_slot

        labels: dict[str, int] = {}
        self.open_label = torch.full((model_vocab,), -1, dtype=torch.long)
        self.close_label = torch.full((model_vocab,), -1, dtype=torch.long)
        self.is_slot = torch.zeros(model_vocab, dtype=torch.bool)
        # With copy: pieces that begin a word (those with ▁: a word's first piece, brackets).
        self.word_start = torch.zeros(model_vocab, dtype=torch.bool)
        for i, piece in enumerate(pieces):
            self.word_start[i] = piece.startswith("\u2581")
            token = piece[1:] if piece.startswith("\u2581") else None
            if not token:
                continue
            if is_word_slot(token):
                self.is_slot[i] = True
            elif token[0] in "()" and len(token) > 1:
                index = labels.setdefault(token[1:], len(labels))
                (self.open_label if token[0] == "(" else self.close_label)[i] = index
        self.is_open, self.is_close = self.open_label >= 0, self.close_label >= 0
        # With copy: every token but brackets and pad, unk, bos, eos (tokenizer ids 0-3).
        self.is_word = ~self.is_open & ~self.is_close
        self.is_word[:4] = False
        self.eos, self.max_depth = eos, max_depth

    @classmethod
    def for_tokenizer(cls, tokenizer, model_vocab: int) -> TreeConstraint:
        return cls(tokenizer.pieces(), model_vocab, tokenizer.eos_id)

    def start(self, words: Tensor, src: Tensor | None = None) -> TreeConstraint:
        """A batch to decode: ``words`` (B,) input words per sentence; ``src`` (B, S), the source
        ids (EOS and padding after the pieces), to copy the words from (``words`` linearization)."""
        self.batch_words, self.batch_src = words.long(), src
        return self

    def begin(self, beam: int, max_len: Tensor) -> None:
        """Fresh state for every row (sentence x beam), each allowed ``max_len`` (R,) tokens before
        EOS; the search calls this."""
        n = self.batch_words.repeat_interleave(beam)
        self.max_len = max_len
        device, R = n.device, n.shape[0]
        for name in ("open_label", "close_label", "is_slot", "is_open", "is_close", "word_start",
                     "is_word"):
            setattr(self, name, getattr(self, name).to(device))
        self.copy = self.batch_src is not None
        if self.batch_src is not None:  # copy: the pieces to write, -1 after them; slots then
            src = self.batch_src.long().repeat_interleave(beam, dim=0)
            real = (src != self.eos) & (src != 0)  # 0: padding
            n = real.sum(dim=1)
            self.src = torch.cat([torch.where(real, src, -1), src.new_full((R, 1), -1)], dim=1)
        self.words, self.slots, self.depth = n, torch.zeros_like(n), torch.zeros_like(n)
        self.stack = torch.full((R, self.max_depth), -1, dtype=torch.long, device=device)
        self.filled = torch.zeros(R, self.max_depth, dtype=torch.bool, device=device)
        self.rooted = torch.zeros(R, dtype=torch.bool, device=device)  # the root has been opened

    def rescore(self, logp: Tensor) -> Tensor:
        """(R, V) log-probabilities as the search should rank them: with copy, the source's next
        piece gets the log of the total probability of every word token."""
        if not self.copy:
            return logp
        rows = torch.arange(logp.shape[0], device=logp.device)
        left = self.slots < self.words
        words = torch.logsumexp(logp.masked_fill(~self.is_word[None, :], NEG_INF), dim=1)
        logp = logp.clone()
        logp[rows[left], self.src[rows[left], self.slots[left]]] = words[left]
        return logp

    def allowed(self, t: int) -> Tensor:
        """(R, V) tokens each row may emit as its token ``t`` (0-based)."""
        rows = torch.arange(self.words.shape[0], device=self.words.device)
        left = self.slots < self.words
        inside = self.depth > 0
        top = (self.depth - 1).clamp(min=0)
        top_label = torch.where(inside, self.stack[rows, top], -2)
        top_filled = self.filled[rows, top] & inside
        # An opening bracket must leave room for the words left and every closing bracket.
        room = t + (self.words - self.slots) + self.depth + 2 <= self.max_len
        between = torch.ones_like(left)  # brackets may go here (with copy: not inside a word)
        if self.copy:
            following = self.src[rows, self.slots]
            between = ~left | self.word_start[following.clamp(min=0)]
        may_open = left & (inside | ~self.rooted) & (self.depth < self.max_depth) & room & between
        may_close = top_filled & ((self.depth > 1) | ~left) & between
        ok = self.is_open[None, :] & may_open[:, None]
        if self.copy:
            ok[rows[left & inside], following[left & inside]] = True
        else:
            ok |= self.is_slot[None, :] & (left & inside)[:, None]
        ok |= (self.is_close[None, :] & may_close[:, None]
               & (self.close_label[None, :] == top_label[:, None]))
        finished = self.rooted & ~inside & ~left
        ok[:, self.eos] = finished
        stuck = ~ok.any(dim=1)
        ok[stuck, self.eos] = True  # cannot happen for a model with every label; never a dead end
        return ok

    def update(self, rows: Tensor, tokens: Tensor) -> None:
        """Rows ``rows`` (of the previous step) carry on with ``tokens``."""
        for name in ("words", "slots", "depth", "stack", "filled", "rooted", "max_len") + (
                ("src",) if self.copy else ()):
            setattr(self, name, getattr(self, name)[rows])
        R = torch.arange(tokens.shape[0], device=tokens.device)
        opens, closes = self.is_open[tokens], self.is_close[tokens]
        if self.copy:  # the source's next piece (anything else was not allowed)
            slots = (self.slots < self.words) & (tokens == self.src[R, self.slots])
        else:
            slots = self.is_slot[tokens]
        d = self.depth
        o = opens.nonzero().squeeze(1)
        self.stack[o, d[o]] = self.open_label[tokens[o]]
        self.filled[o, d[o]] = False
        self.rooted |= opens
        s = slots & (d > 0)
        self.filled[R[s], (d[s] - 1)] = True
        self.slots = self.slots + s.long()
        c = closes & (d > 0)
        self.depth = d + opens.long() - c.long()
        parent = c & (self.depth > 0)
        self.filled[R[parent], self.depth[parent] - 1] = True
