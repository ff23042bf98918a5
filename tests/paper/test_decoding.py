"""Greedy and beam search: beam 1 is greedy, the cache changes nothing, lengths are bounded."""

import dataclasses

import pytest
import torch

from reproduce.config import ModelConfig
from reproduce.paper.decoding import beam_search, greedy_search, length_penalty
from reproduce.paper.model import Transformer

BOS, EOS = 2, 3
CONFIG = ModelConfig(vocab_size=40, N=2, d_model=32, d_ff=64, h=4, d_k=8, d_v=8, p_drop=0.0)


@pytest.fixture(scope="module", params=["post-norm", "pre-norm"])
def model(request):
    torch.manual_seed(0)
    m = Transformer(dataclasses.replace(CONFIG, wiring=request.param)).double().eval()
    # Make EOS likely enough that hypotheses end at different lengths.
    with torch.no_grad():
        m.embed.weight[EOS] *= 3
    return m


@pytest.fixture(scope="module")
def src():
    g = torch.Generator().manual_seed(5)
    s = torch.randint(4, 40, (6, 9), generator=g)
    s[1, 6:] = 0
    s[4, 3:] = 0
    return s


def test_cached_greedy_equals_uncached(model, src):
    assert greedy_search(model, src, BOS, EOS, 12) == \
        greedy_search(model, src, BOS, EOS, 12, use_cache=False)


@pytest.mark.parametrize("beam", [2, 4])
def test_cached_beam_equals_uncached(model, src, beam):
    assert beam_search(model, src, BOS, EOS, beam=beam, max_len_offset=12) == \
        beam_search(model, src, BOS, EOS, beam=beam, max_len_offset=12, use_cache=False)


def test_beam_one_is_greedy(model, src):
    assert beam_search(model, src, BOS, EOS, beam=1, max_len_offset=12) == \
        greedy_search(model, src, BOS, EOS, 12)


def test_output_length_is_bounded_by_input_plus_offset(model, src):
    lengths = (src != 0).sum(1).tolist()
    for out, n in zip(beam_search(model, src, BOS, EOS, beam=3, max_len_offset=2), lengths,
                      strict=True):
        assert len(out) <= n + 2
        assert EOS not in out and BOS not in out


def test_batched_equals_one_at_a_time(model, src):
    batched = beam_search(model, src, BOS, EOS, beam=4, max_len_offset=12)
    single = [beam_search(model, src[i:i + 1, :int((src[i] != 0).sum())], BOS, EOS, beam=4,
                          max_len_offset=12)[0] for i in range(src.shape[0])]
    assert batched == single


@pytest.mark.parametrize("use_cache", [True, False])
def test_finished_sentences_leave_the_search(model, src, use_cache, monkeypatch):
    """Rows per step shrink as sentences finish, and the outputs are those of each sentence alone
    (also the source's keys and values, kept once per sentence, follow the sentences that stay)."""
    rows = []
    step = model.step
    monkeypatch.setattr(model, "step", lambda state, tokens: (rows.append(len(tokens)),
                                                               step(state, tokens))[1])
    batched = beam_search(model, src, BOS, EOS, beam=3, max_len_offset=12, use_cache=use_cache)
    monkeypatch.undo()
    assert rows[0] == 3 * src.shape[0] and rows[-1] < rows[0]
    assert rows == sorted(rows, reverse=True) and all(r % 3 == 0 for r in rows)
    single = [beam_search(model, src[i:i + 1], BOS, EOS, beam=3, max_len_offset=12)[0]
              for i in range(src.shape[0])]
    assert batched == single


def _score(model, src, hyp, alpha):
    """Length-normalised log-probability of one hypothesis, by teacher forcing."""
    tgt = torch.tensor([[BOS] + hyp])
    logp = torch.log_softmax(model(src[None], tgt).double(), -1)[0]
    total = sum(logp[i, t].item() for i, t in enumerate(hyp + [EOS]))
    return total / length_penalty(len(hyp) + 1, alpha)


def test_beam_finds_at_least_as_good_a_hypothesis_as_greedy(model, src):
    for i in range(src.shape[0]):
        s = src[i, : int((src[i] != 0).sum())]
        g = greedy_search(model, s[None], BOS, EOS, 12)[0]
        b = beam_search(model, s[None], BOS, EOS, beam=8, alpha=0.6, max_len_offset=12)[0]
        assert _score(model, s, b, 0.6) >= _score(model, s, g, 0.6) - 1e-9


def test_length_penalty_formula():
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(7, 0.6) == pytest.approx(2.0 ** 0.6)
    assert length_penalty(10, 0.0) == 1.0


# --- constrained decoding of parse trees (Table 4, decode.constrained) ---------------------------

PIECES = ["<pad>", "<unk>", "<s>", "</s>", "\u2581(S", "\u2581)S", "\u2581(NP", "\u2581)NP",
          "\u2581(VP", "\u2581)VP", "\u2581NN", "\u2581DT", "\u2581XX", "\u2581word", "\u2581."]
PIECES += [f"\u2581w{i}" for i in range(40 - len(PIECES) - 3)]  # the model has 3 ids beyond


@pytest.mark.parametrize("beam", [1, 3])
def test_constrained_search_writes_a_well_formed_tree_over_exactly_the_words(model, src, beam):
    from reproduce.paper.decoding import TreeConstraint
    from reproduce.paper.parsing import well_formed

    words = torch.tensor([1, 2, 5, 7, 3, 9])
    constraint = TreeConstraint(PIECES, CONFIG.vocab_size, EOS).start(words)
    if beam == 1:
        out = greedy_search(model, src, BOS, EOS, 60, constraint=constraint)
    else:
        out = beam_search(model, src, BOS, EOS, beam=beam, max_len_offset=60, constraint=constraint)
    for ids, n in zip(out, words.tolist(), strict=True):
        tokens = [PIECES[i][1:] for i in ids]
        assert well_formed(tokens, n), (n, tokens)
    free = beam_search(model, src, BOS, EOS, beam=max(beam, 2), max_len_offset=60)
    assert not all(well_formed([PIECES[i][1:] for i in ids if i < len(PIECES)], n)
                   for ids, n in zip(free, words.tolist(), strict=True))  # the random model alone


# Word pieces for the `words` linearization: a word starts with ▁, its other pieces do not.
COPY_PIECES = PIECES[:15] + ["\u2581wo", "rd", "s", "\u2581a", "\u2581b", "c"]
COPY_PIECES += [f"x{i}" for i in range(40 - len(COPY_PIECES) - 3)]


@pytest.mark.parametrize("beam", [1, 3])
def test_copy_constraint_writes_the_source_pieces_with_brackets_only_between_words(model, beam):
    """With the `words` linearization the search copies the source's pieces in order, opens and
    closes brackets only between words, and the detokenized output is a well-formed tree."""
    from reproduce.paper.decoding import TreeConstraint
    from reproduce.paper.parsing import well_formed

    # Sentences as piece ids (EOS, then padding): "words a", "bc wo", "a words wo b".
    ids = {p: i for i, p in enumerate(COPY_PIECES)}
    sentences = [["\u2581wo", "rd", "s", "\u2581a"], ["\u2581b", "c", "\u2581wo"],
                 ["\u2581a", "\u2581wo", "rd", "s", "\u2581wo", "\u2581b"]]
    width = max(map(len, sentences)) + 1
    src = torch.tensor([[ids[p] for p in s] + [EOS] + [0] * (width - len(s) - 1) for s in sentences])
    n_words = torch.tensor([sum(p.startswith("\u2581") for p in s) for s in sentences])
    constraint = TreeConstraint(COPY_PIECES, CONFIG.vocab_size, EOS).start(n_words, src)
    if beam == 1:
        out = greedy_search(model, src, BOS, EOS, 60, constraint=constraint)
    else:
        out = beam_search(model, src, BOS, EOS, beam=beam, max_len_offset=60, constraint=constraint)
    for hyp, pieces in zip(out, sentences, strict=True):
        written = [COPY_PIECES[i] for i in hyp]
        assert [p for p in written if p[1:2] not in ("(", ")")] == pieces  # the words, copied
        text = "".join(written).replace("\u2581", " ").split()
        assert well_formed(text, sum(p.startswith("\u2581") for p in pieces), "words"), text
