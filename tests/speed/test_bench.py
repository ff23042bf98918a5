"""The benchmark's contenders are our model (same size, same function) and its quick mode runs end
to end; MarianMT parts skip without ``transformers`` (the ``bench`` extra, which ``nox -s tests``
installs and README's test command does not)."""

import json

import pytest
import torch

from reproduce.__main__ import main
from reproduce.config import ModelConfig
from reproduce.paper.decoding import beam_search, greedy_search
from reproduce.paper.model import Transformer
from reproduce.speed import decoding_peers as bench_decoding
from reproduce.speed import inputs as bench_inputs
from reproduce.speed import peers
from reproduce.speed import timing as bench_timing
from tests.helpers import smoothed_loss

BOS, EOS = 2, 3
CONFIG = ModelConfig(vocab_size=50, N=2, d_model=32, d_ff=64, h=4, d_k=8, d_v=8)


@pytest.fixture(scope="module")
def ours():
    torch.manual_seed(0)
    model = Transformer(CONFIG).eval()
    with torch.no_grad():  # make EOS likely, so that hypotheses end at different lengths
        model.embed.weight[EOS] *= 3
    return model


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 50, (4, 9), generator=g), torch.randint(4, 50, (4, 8), generator=g)
    src[1, 5:], tgt[2, 6:] = 0, 0
    tgt[:, 0] = BOS
    return src, tgt


def test_torch_nn_build_is_our_model(ours, batch):
    theirs = peers.TorchTransformer(CONFIG).eval()
    assert peers.trainable_parameters(theirs) == peers.trainable_parameters(ours)
    peers.copy_into_torch(ours, theirs)
    with torch.no_grad():
        torch.testing.assert_close(theirs(*batch), ours(*batch), atol=1e-5, rtol=1e-5)


def test_marian_build_is_our_model(ours, batch):
    pytest.importorskip("transformers")
    theirs = peers.marian(CONFIG, BOS, EOS).eval()
    assert peers.trainable_parameters(theirs) == peers.trainable_parameters(ours)
    peers.copy_into_marian(ours, theirs)
    with torch.no_grad():
        torch.testing.assert_close(peers.marian_logits(theirs, *batch, pad_id=0), ours(*batch),
                                   atol=1e-5, rtol=1e-5)


def test_marian_generate_matches_our_search(ours):
    pytest.importorskip("transformers")
    theirs = peers.marian(CONFIG, BOS, EOS).eval()
    peers.copy_into_marian(ours, theirs)
    src = torch.randint(4, 50, (6, 7), generator=torch.Generator().manual_seed(2))
    assert peers.marian_generate(theirs, src, 1, 0.6, 10, 0, BOS, EOS) == \
        greedy_search(ours, src, BOS, EOS, 10)
    # Length penalties differ for alpha > 0 (|Y|^alpha against GNMT's); at alpha 0 both rank alike.
    assert peers.marian_generate(theirs, src, 4, 0.0, 10, 0, BOS, EOS) == \
        beam_search(ours, src, BOS, EOS, beam=4, alpha=0.0, max_len_offset=10)


def test_peer_loss_is_our_loss(batch):
    logits = torch.randn(4, 8, 50, dtype=torch.double)
    tgt = batch[1]
    torch.testing.assert_close(peers.smoothed_cross_entropy(logits, tgt, 0.1, 0),
                               smoothed_loss(logits, tgt, 0.1, 0)[0].float())


def test_synthetic_batches_fit_the_token_budget():
    batches = bench_inputs.synthetic_batches(100, 512, 3, 64, seed=0)
    assert len(batches) == 3
    for b in batches:
        (B, S), T = b["src"].shape, b["tgt_in"].shape[1]
        assert B * max(S, T) <= 512
        assert (b["tgt_in"][:, 0] == BOS).all()
        assert torch.equal(b["tgt_in"][:, 1:], b["tgt_out"][:, :-1])
        assert ((b["src"] == EOS).sum(1) == 1).all() and ((b["tgt_out"] == EOS).sum(1) == 1).all()


def test_interleaved_rotates_the_order():
    calls = []
    bench_timing.interleaved({k: (lambda k=k: calls.append(k)) for k in "abc"}, rounds=3, warmup=0)
    assert "".join(calls) == "abcbcacab"


def test_decoding_without_transformers(monkeypatch, ours):
    def missing(*args, **kwargs):
        raise ImportError("no transformers")

    monkeypatch.setattr(bench_decoding, "marian", missing)
    src = torch.randint(4, 50, (3, 5), generator=torch.Generator().manual_seed(3))
    results, checks = bench_decoding.bench_decoding(ours, [src], rounds=1, beam=4, alpha=0.6, offset=5)
    assert [r.name for r in results] == ["greedy | ours, cached", "greedy | ours, uncached",
                                         "beam 4 | ours, cached", "beam 4 | ours, uncached"]
    assert checks["greedy: cached == uncached"] and checks["beam 4: cached == uncached"]


def test_quick_bench_writes_the_report(tmp_path):
    out = tmp_path / "performance.md"
    code = main(["bench", "--quick", "--scales", "smoke", "--data", "synthetic", "--threads", "1",
                 "--set", "N=1", "--no-lightning", "--out", str(out), "--scales", "smoke"])
    assert code == 0
    report = out.read_text()
    assert "python -m reproduce bench --quick --scales smoke" in report
    for needle in ("| ours |", "| torch.nn.Transformer |", "float32", "cached == uncached: True",
                   "| beam 4 | ours, uncached |", "against the fastest peer"):
        assert needle in report
    raw = json.loads(out.with_suffix(".json").read_text())
    assert [r["name"] for r in raw["sections"][0]["train"]][0] == "ours"
    assert len(raw["sections"]) == 1  # a scale given twice is measured once


def test_the_compiled_step_trains_as_the_eager_step_does_for_20_steps():
    """bench's compiled contender really compiles our model (graphs counted after clearing the
    counters) and its training follows eager's: each of 20 Adam steps' loss within 1e-3
    (relative). Dropout off: a compiled graph draws its masks from another generator. The steps
    cycle through 4 token-count batches of different shapes and padding, as a run's do: compiled
    once, never again (the chunked output loss traced made dynamo recompile per batch until
    its limit, and a GPU run compiled for minutes)."""
    from torch._dynamo.utils import counters

    from reproduce.records.sweep import load_spec
    from reproduce.speed.training import module_loss, plain_step
    from reproduce.train.lit import TranslationModule
    from reproduce.train.step_time import compile_stats

    config = load_spec("table3").resolve("base", "smoke").overrides(N=1, p_drop=0.0)
    batches = bench_inputs.synthetic_batches(config.model.vocab_size, 256, 4, 48, seed=4)
    assert len({tuple(b["tgt_out"].shape) for b in batches}) == 4
    torch.manual_seed(0)
    eager = TranslationModule(config.to_dict())
    compiled = TranslationModule(config.overrides(compile=True).to_dict())  # train.compile
    compiled.model.load_state_dict(eager.model.state_dict())
    counters.clear()
    losses: dict[str, list[float]] = {"eager": [], "compiled": []}
    plain_step(eager.model, module_loss(eager), config, "32-true", losses["eager"])(batches * 5)
    train_compiled = plain_step(compiled.model, module_loss(compiled), config, "32-true",
                                losses["compiled"])
    train_compiled(batches[:1])
    first = compile_stats()["graphs"]
    train_compiled((batches * 5)[1:])
    assert first >= 1
    asked = compile_stats()
    assert asked["cache_hits"] + asked["cache_misses"] >= 1  # the kernels' cache was asked
    assert compile_stats()["graphs"] == first  # no graph for a new shape
    assert losses["eager"][-4] < losses["eager"][0]  # it trains (the same batch 4 steps on)
    for step, (a, b) in enumerate(zip(losses["eager"], losses["compiled"], strict=True)):
        assert abs(a - b) <= 1e-3 * abs(a), (step, a, b)


def test_train_compile_trains_a_run_through_the_compiled_loss(monkeypatch):
    """``train.compile``: a run's training steps call the fast path's loss as torch.compile made
    it (the same compiled function whose losses follow eager's, above); evaluation stays eager.
    torch.compile is replaced by a recorder here: what is checked is the wiring, not the
    compiler."""
    from reproduce.records.sweep import load_spec
    from reproduce.speed.training import lightning_loop
    from reproduce.train.lit import TranslationModule

    calls = []

    def recording_compile(fn, **options):
        def compiled(*args, **kwargs):
            calls.append(fn.__name__)
            return fn(*args, **kwargs)
        return compiled

    monkeypatch.setattr(torch, "compile", recording_compile)
    config = load_spec("table3").resolve("base", "smoke").overrides(N=1)
    batches = bench_inputs.synthetic_batches(config.model.vocab_size, 256, 3, 32, seed=0)
    assert not TranslationModule(config.to_dict()).fast
    module = TranslationModule(config.overrides(compile=True).to_dict())
    lightning_loop(module, "32-true")(batches)
    assert calls == ["_padded_losses"] * 3  # every training step, through the compiled function
