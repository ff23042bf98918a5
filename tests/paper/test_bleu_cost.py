"""The paper's tokenized BLEU, checkpoint averaging and training cost, against hand counts."""

import math
from importlib.metadata import version

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from reproduce.config import ModelConfig
from reproduce.paper.bleu import moses_tokenize, multi_bleu, split_compounds, tokenized_bleu
from reproduce.paper.flops import analytic_flops, forward_flops_per_token, gpu_tflops, paper_cost
from reproduce.paper.model import Transformer
from reproduce.records.averaging import average_checkpoints
from reproduce.records.checkpoints import last_checkpoints
from reproduce.train.evaluate import sacre_bleu

# --- tokenized BLEU --------------------------------------------------------------------------------

HYPS = ["Die rot-grüne Koalition hat gewonnen.", "Wir danken Ihnen sehr."]
REFS = ["Die rot-grüne Regierung hat gewonnen.", "Wir danken Ihnen sehr herzlich."]
# Moses (de) splits off the final full stops; splitting turns "rot-grüne" into three tokens
# (@ below is ##AT##-##AT##):
#   hyp 1: Die rot @ grüne Koalition hat gewonnen .   (8)   ref 1: ... Regierung ...        (8)
#   hyp 2: Wir danken Ihnen sehr .                     (5)   ref 2: Wir danken Ihnen sehr herzlich . (6)
# Clipped matches / hypothesis n-grams, sentence 1 + sentence 2:
#   1-grams: 7/8 (all but Koalition)                          + 5/5 = 12/13
#   2-grams: Die rot, rot @, @ grüne, hat gewonnen, gewonnen . = 5/7 + 3/4 ("sehr ." misses) = 8/11
#   3-grams: Die rot @, rot @ grüne, hat gewonnen .  = 3/6    + 2/3 = 5/9
#   4-grams: Die rot @ grüne                         = 1/5    + 1/2 (Wir danken Ihnen sehr) = 2/7
#   c = 13 < r = 14: BP = exp(1 - 14/13)
# Without splitting "rot-grüne" is one token: 10/11, 6/9, 3/7, 1/5, c = 11, r = 12. The shared
# "##AT##-##AT##" adds matching n-grams, so splitting raises the score, as the paper's convention does.
SPLIT_BLEU = 100 * math.exp(1 - 14 / 13) * (12 / 13 * 8 / 11 * 5 / 9 * 2 / 7) ** 0.25  # 52.904
UNSPLIT_BLEU = 100 * math.exp(1 - 12 / 11) * (10 / 11 * 6 / 9 * 3 / 7 * 1 / 5) ** 0.25  # 43.592


def test_tokenized_bleu_matches_the_hand_count():
    result = tokenized_bleu(HYPS, REFS, "de")
    assert result["score"] == round(SPLIT_BLEU, 2) == 52.90
    assert result["kind"] == "tokenized-compound-split" and result["sentences"] == 2
    hyp = [split_compounds(line) for line in moses_tokenize(HYPS, "de")]
    ref = [split_compounds(line) for line in moses_tokenize(REFS, "de")]
    assert hyp[0] == "Die rot ##AT##-##AT## grüne Koalition hat gewonnen ."
    score = multi_bleu(hyp, ref)
    assert (score.counts, score.totals) == ([12, 8, 5, 2], [13, 11, 9, 7])
    assert (score.sys_len, score.ref_len) == (13, 14)
    assert score.score == pytest.approx(SPLIT_BLEU, abs=1e-9)


def test_compound_splitting_changes_the_score_as_counted():
    unsplit = multi_bleu(moses_tokenize(HYPS, "de"), moses_tokenize(REFS, "de"))
    assert (unsplit.counts, unsplit.totals) == ([10, 6, 3, 1], [11, 9, 7, 5])
    assert unsplit.score == pytest.approx(UNSPLIT_BLEU, abs=1e-9)
    assert round(unsplit.score, 2) == 43.59 != tokenized_bleu(HYPS, REFS, "de")["score"]


def test_no_smoothing_a_zero_precision_gives_zero():
    # Sentence 1 alone, unsplit, has no matching 4-gram (0/3): multi-bleu.perl prints 0. Split, it
    # has one (1/5): (7/8 * 5/7 * 3/6 * 1/5) ** (1/4) = (1/16) ** (1/4) = 0.5, lengths equal.
    tok_hyp, tok_ref = moses_tokenize(HYPS[:1], "de"), moses_tokenize(REFS[:1], "de")
    assert multi_bleu(tok_hyp, tok_ref).score == 0.0
    assert tokenized_bleu(HYPS[:1], REFS[:1], "de")["score"] == 50.0


def test_hyphen_chains_split_fully_or_as_the_script_does():
    assert split_compounds("rich-text format") == "rich ##AT##-##AT## text format"
    assert split_compounds("a-b-c") == "a ##AT##-##AT## b ##AT##-##AT## c"
    # get_ende_bleu.sh's single perl pass consumes "b", so the second hyphen stays attached.
    assert split_compounds("a-b-c", split_chains=False) == "a ##AT##-##AT## b-c"
    assert split_compounds("-f g- 3 - 4") == "-f g- 3 - 4"  # a hyphen needs a non-space on both sides
    chained = tokenized_bleu(["Mitte-links-Koalition ."], ["Mitte-links-Koalition ."], "de")
    script = tokenized_bleu(["Mitte-links-Koalition ."], ["Mitte-links-Koalition ."], "de",
                            split_chains=False)
    assert chained["signature"] != script["signature"]


def test_sacrebleu_and_tokenized_bleu_are_labelled_apart():
    sacre, tokenized = sacre_bleu(HYPS, REFS), tokenized_bleu(HYPS, REFS, "de")
    assert sacre["kind"] == "sacrebleu" and tokenized["kind"] == "tokenized-compound-split"
    assert sacre["signature"] != tokenized["signature"]
    for part in ("moses-de", "##AT##-##AT##", "multi-bleu-4gram", "smooth:none",
                 f"sacremoses:{version('sacremoses')}", f"sacrebleu:{version('sacrebleu')}"):
        assert part in tokenized["signature"]


def test_tokenized_bleu_rejects_unpaired_input():
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        tokenized_bleu(HYPS, REFS[:1], "de")


# --- checkpoint averaging ---------------------------------------------------------------------------


def weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"layer.weight": torch.randn(3, 2, generator=g),
            "layer.half": torch.randn(4, generator=g).half(),
            "steps": torch.tensor(seed),  # an integer buffer: never averaged
            "mask": torch.tensor([True, seed % 2 == 0])}


@pytest.mark.parametrize("lightning", [True, False])
def test_average_is_the_mean_of_the_saved_weights(tmp_path, lightning):
    paths = []
    for seed in (1, 2, 3):
        path = tmp_path / f"step{seed}.ckpt"
        torch.save({"state_dict": weights(seed), "global_step": seed} if lightning else weights(seed),
                   path)
        paths.append(path)
    averaged = average_checkpoints(paths)
    saved = [weights(seed) for seed in (1, 2, 3)]
    for key in ("layer.weight", "layer.half"):
        mean = sum(w[key].double() for w in saved) / 3
        assert averaged[key].dtype == saved[0][key].dtype
        assert torch.equal(averaged[key], mean.to(saved[0][key].dtype))
    assert torch.equal(averaged["steps"], torch.tensor(3))  # the last checkpoint's
    assert torch.equal(averaged["mask"], torch.tensor([True, False]))
    assert list(averaged) == list(saved[0])


def test_averaged_weights_load_into_the_model(tmp_path):
    config = ModelConfig(vocab_size=50, N=1, d_model=8, d_ff=16, h=2, d_k=4, d_v=4)
    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        paths.append(tmp_path / f"step{seed}.ckpt")
        torch.save({"state_dict": Transformer(config).state_dict()}, paths[-1])
    model = Transformer(config)
    model.load_state_dict(average_checkpoints(paths))  # strict: same keys, same shapes


def test_mismatched_checkpoints_are_named(tmp_path):
    good, extra, reshaped = tmp_path / "good.pt", tmp_path / "extra.pt", tmp_path / "reshaped.pt"
    torch.save(weights(1), good)
    torch.save({**weights(2), "layer.bias": torch.zeros(3)}, extra)
    torch.save({**weights(2), "layer.weight": torch.zeros(2, 3)}, reshaped)
    with pytest.raises(ValueError, match=r"extra\.pt: keys differ .*unexpected \['layer.bias'\]"):
        average_checkpoints([good, extra])
    with pytest.raises(ValueError, match=r"reshaped\.pt: layer.weight has shape \(2, 3\)"):
        average_checkpoints([good, reshaped])
    with pytest.raises(ValueError, match="no checkpoints"):
        average_checkpoints([])


def test_last_checkpoints_orders_by_step_number(tmp_path):
    for name in ("step10.ckpt", "step2.ckpt", "step9.ckpt", "step1.ckpt", "last.ckpt", "notes.txt"):
        (tmp_path / name).touch()
    def names(k: int) -> list[str]:
        return [p.name for p in last_checkpoints(tmp_path, k)]

    assert names(3) == ["step2.ckpt", "step9.ckpt", "step10.ckpt"]  # 2 < 9 < 10, not as text
    assert names(20) == ["step1.ckpt", "step2.ckpt", "step9.ckpt", "step10.ckpt"]  # fewer than k
    (tmp_path / "step10-v1.ckpt").touch()  # Lightning's name for a second save of step 10
    assert names(2) == ["step9.ckpt", "step10-v1.ckpt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no step<N>.ckpt"):
        last_checkpoints(empty, 5)


# --- training cost -----------------------------------------------------------------------------------


def test_paper_cost_reproduces_table_2():
    # Base: 12 hours on 8 P100s; big: 3.5 days. Table 2 prints 3.3e18 and 2.3e19.
    base, big = paper_cost(12, 8, gpu_tflops("Tesla P100-SXM2-16GB")), paper_cost(3.5 * 24, 8, 9.5)
    assert base == pytest.approx(3.2832e18) and f"{base:.1e}" == "3.3e+18"
    assert big == pytest.approx(2.29824e19) and f"{big:.1e}" == "2.3e+19"


def test_a_run_on_a_shared_gpu_counts_its_share_of_it(monkeypatch):
    from reproduce.config import Config
    from reproduce.records.store import device_hours
    from reproduce.tables.common import cost_line
    from reproduce.train import runner

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    work = {"src_tokens": 1000, "tgt_tokens": 1000, "src_sq": 0, "tgt_sq": 0, "cross": 0}
    monkeypatch.delenv("REPRODUCE_GPU_SHARE", raising=False)
    alone = runner._cost(Config(), work, 3600.0, 1)
    monkeypatch.setenv("REPRODUCE_GPU_SHARE", "4")  # set by --workers: 4 of them on this GPU
    shared = runner._cost(Config(), work, 3600.0, 1)
    assert alone["gpu_shared_by"] == 1 and shared["gpu_shared_by"] == 4
    assert shared["paper_method_flops"] == pytest.approx(alone["paper_method_flops"] / 4)
    assert "shared by 4 workers" in shared["tflops_source"]
    assert shared["analytic_flops"] == alone["analytic_flops"]  # the work done is the same
    record = {"metrics": {"train_seconds": 3600.0}, "cost": shared,
              "hardware": {"cpu": "Xeon", "gpus": ["NVIDIA H200"]}}
    assert device_hours(record) == pytest.approx(0.25)
    assert cost_line([record]) == ("Cost: 1.0 worker-hours of training for 1 runs on 1x NVIDIA "
                                   "H200, 4 runs side by side.")


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 80GB HBM3", 67.0), ("NVIDIA H100 PCIe", 51.0), ("NVIDIA H200", 67.0),
    ("Tesla V100-SXM2-16GB", 15.7), ("Tesla V100-PCIE-32GB", 14.0), ("Tesla P100-PCIE-16GB", 9.5),
    ("Tesla K80", 2.8), ("NVIDIA A100-SXM4-80GB", 19.5), ("NVIDIA L4", 30.3), ("NVIDIA L40S", 91.6),
    ("Tesla T4", 8.1), ("NVIDIA A10G", None), ("cpu", None),
])
def test_gpu_tflops_matches_device_names(name, tflops):
    assert gpu_tflops(name) == tflops


TINY = ModelConfig(vocab_size=50, N=2, d_model=16, d_ff=32, h=4, d_k=4, d_v=6, p_drop=0.0)


def test_forward_flops_per_token_by_hand():
    # Multiply-adds per layer: projections 16 * (2*16 + 2*24) = 1280 (h*d_k = 16, h*d_v = 24),
    # FFN 2 * 16 * 32 = 1024, cross-attention's K, V or Q, O: 16 * (16 + 24) = 640.
    # Source: 2 * (1280 + 1024 + 640) = 5888; target: 2 * (1280 + 640 + 1024) + 16 * 50 = 6688.
    assert forward_flops_per_token(TINY) == (2 * 5888, 2 * 6688)


def test_analytic_flops_match_torch_flop_counter():
    B, S, T = 2, 5, 7
    torch.manual_seed(0)
    model = Transformer(TINY)
    src, tgt = torch.randint(1, 50, (B, S)), torch.randint(1, 50, (B, T))
    counter = FlopCounterMode(display=False)
    with counter:
        model(src, tgt).sum().backward()
    counted = analytic_flops(TINY, B * S, B * T, B * S * S, B * T * T, B * T * S)
    # 3 x 2 x (10 * 5888 + 14 * 6688 + 2 layers * 4 * (4 + 6) * (50 + 98 + 70)) = 1019712
    assert counted == counter.get_total_flops() == 1_019_712
