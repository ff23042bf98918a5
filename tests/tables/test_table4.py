"""Table 4: the spec, the treebank data path, the real CLI at smoke scale on a tiny hand-written
WSJ layout (no NLTK sample needed), tuning with a persistent optuna study, and the rendered table."""

import json
import logging
from pathlib import Path

import nltk
import pytest
from nltk.tree import Tree

from reproduce.__main__ import main
from reproduce.config import PARSING
from reproduce.data import load_pairs, missing_input, tree_symbols, treebank_trees
from reproduce.data.source import CorpusSource
from reproduce.errors import DataError, SpecError
from reproduce.paper.evalb import bracket_f1
from reproduce.paper.parsing import delinearize, linearize, tag_pos, words
from reproduce.paper.tokenizer import train_tokenizer
from reproduce.records.sweep import load_spec
from reproduce.tables.table4 import render_table4
from reproduce.train import parses
from tests.helpers import treebank_sample_present

# PTB .mrg style: an unlabelled root, function tags, co-indices, traces, punctuation.
TRAIN = [
    "(S (NP-SBJ (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog))) (. .))",
    "(S (NP-SBJ (DT The) (NN man)) (VP (VBD saw) (NP (DT a) (NN dog)) (PP-LOC (IN in) (NP (DT the)"
    " (NN park)))) (. .))",
    "(S (NP-SBJ-1 (PRP It)) (VP (VBD was) (VP (VBN sold) (NP (-NONE- *-1)))) (. .))",
    "(S (NP-SBJ (NNS Prices)) (VP (VBD fell) (ADVP-TMP (RB yesterday))) (. .))",
    "(S (NP-SBJ (NNP Mary)) (VP (VBZ likes) (NP (JJ red) (NNS apples))) (. .))",
    "(S (NP-SBJ (PRP He)) (VP (VBD gave) (PRT (RP up)) (NP (DT the) (NN fight))) (. .))",
    "(S (NP-SBJ (DT The) (NN company)) (VP (VBD said) (SBAR (-NONE- 0) (S (NP-SBJ (NNS profits))"
    " (VP (VBD rose))))) (. .))",
    "(S (NP-SBJ (NNS Dogs)) (VP (VBP bark) (PP (IN at) (NP (NNS cats)))) (. .))",
]
DEV = [
    "(S (NP-SBJ (NNP John)) (VP (VBD saw) (NP (DT the) (NN man))) (. .))",
    "(S (NP-SBJ (NNS Prices)) (VP (VBD rose)) (. .))",
]
TEST = [
    "(S (NP-SBJ (DT The) (NN dog)) (VP (VBD saw) (NP (NNP Mary)) (PP (IN in) (NP (DT the)"
    " (NN park)))) (. .))",
    "(S (NP-SBJ (PRP He)) (VP (VBZ likes) (NP (NNS apples))) (. .))",
]


def write_wsj(root: Path) -> Path:
    """A WSJ layout (parsed/mrg/wsj) with one file in sections 02 (train), 22 (dev), 23 (test)."""
    for section, trees in (("02", TRAIN), ("22", DEV), ("23", TEST)):
        folder = root / section
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"wsj_{section}01.mrg").write_text("".join(f"( {t} )\n" for t in trees))
    return root


@pytest.fixture
def wsj(tmp_path, monkeypatch):
    monkeypatch.setattr(nltk.data, "path", list(nltk.data.path))
    return write_wsj(tmp_path / "wsj")


# --- the spec ----------------------------------------------------------------------------------


def test_spec_has_the_papers_rows_settings_and_cited_figures():
    spec = load_spec("table4")
    assert spec.split == "test" and spec.preset == "parsing"
    assert {name: v.paper["f1"] for name, v in spec.variants.items()} == {
        "wsj_only": 91.3, "wsj_only_words": 91.3, "wsj_only_bpe": 91.3, "semi_supervised": 92.7}
    # the paper's BPE at its scale; one token a word on the sample, but for the BPE variant
    assert spec.resolve("wsj_only", "paper").data.vocabulary == "bpe"
    assert [spec.resolve(v, "cpu").data.vocabulary for v in ("wsj_only", "wsj_only_bpe")] == [
        "words", "bpe"]
    wsj, semi = (spec.resolve(v, "paper") for v in ("wsj_only", "semi_supervised"))
    assert wsj.model == PARSING.model.__class__(**{**PARSING.model.__dict__, "p_drop": 0.2,
                                                   "p_attn": 0.2})
    assert (wsj.model.N, wsj.model.d_model, wsj.model.vocab_size, semi.model.vocab_size) == (
        4, 1024, 16000, 32000)
    assert (wsj.decode.beam, wsj.decode.alpha, wsj.decode.max_len_offset) == (21, 0.3, 300)
    assert (wsj.data.corpus, semi.data.corpus) == ("wsj-parse", "wsj-parse-semi")
    assert spec.resolve("wsj_only", "cpu").model.d_model == 256  # the shared width factor
    smoke = spec.resolve("wsj_only", "smoke")
    assert smoke.model.vocab_size < 1000 and smoke.decode.beam < 21
    assert smoke.model.max_positions >= smoke.train.max_tokens_per_sentence
    cited = [(r["parser"], r["training"], r["f1"]) for r in spec.cited]
    assert len(cited) == 12
    assert cited[0] == ("Vinyals & Kaiser et al. (2014)", "WSJ only, discriminative", 88.3)
    assert cited[-1] == ("Dyer et al. (2016)", "generative", 93.3)
    assert [r["ours"] for r in spec.cited if "ours" in r] == [
        ["wsj_only", "wsj_only_bpe", "wsj_only_words"], "semi_supervised"]
    # Word targets (not the paper's) only change the target format, and run only when named.
    words = spec.resolve("wsj_only_words", "cpu")
    assert words.data.linearization == "words"
    assert words.overrides(linearization="tags") == spec.resolve("wsj_only", "cpu")
    assert spec.select() == ["wsj_only", "semi_supervised"]
    assert spec.row_of("wsj_only_words") == "wsj_only_words"
    assert {(r["parser"], r["f1"]) for r in spec.cited if "ours" in r} == {
        ("Transformer (4 layers)", 91.3), ("Transformer (4 layers)", 92.7)}


def test_only_dropout_learning_rate_and_beam_are_tuned():
    spec = load_spec("table4")
    tuning = spec.search_space("paper")
    assert (tuning.metric, tuning.direction) == ("dev_f1", "maximize")
    assert set(tuning.knobs) == {"p_drop", "p_attn", "lr_scale", "beam"}
    assert 21 in tuning.knobs["beam"].choices and tuning.knobs["lr_scale"].log
    assert max(spec.search_space("smoke").knobs["beam"].choices) <= 2


@pytest.mark.parametrize("tune, message", [
    ("{metric: dev_f1, knobs: {h: {choices: [2, 4]}}}", r"tune.knobs.h: h is varied by a row"),
    ("{metric: dev_f1, knobs: {d_ff: {low: 1, high: 2}}}", r"d_ff is varied by a row or resized"),
    ("{metric: dev_f1, knobs: {p_dorp: {low: 0.1, high: 0.2}}}", r"unknown config key 'p_dorp'"),
    ("{metric: dev_f1, knobs: {p_drop: {low: 0.3, high: 0.2}}}", r"needs numbers low < high"),
    ("{metric: dev_f1, knobs: {beam: {choices: [0]}}}", r"decode.beam = 0"),
    ("{metric: dev_f1, direction: up, knobs: {beam: {choices: [1]}}}", r"allowed values are max"),
])
def test_bad_tuning_sections_fail_with_one_line(tmp_path, tune, message):
    path = tmp_path / "bad.yaml"
    path.write_text(f"variants: {{base: {{}}, A: {{set: {{h: 2}}}}}}\ntune: {tune}\n")
    with pytest.raises(SpecError, match=message):
        load_spec(path)


# --- data ----------------------------------------------------------------------------------------


def test_treebank_pairs_round_trip_through_linearization(wsj):
    gold = {"train": TRAIN, "dev": DEV, "test": TEST}
    for split, texts in gold.items():
        for linearization in ("tags", "xx", "words"):
            pairs = load_pairs("wsj-parse", split, str(wsj), linearization=linearization)
            assert len(pairs) == len(texts)
            for (sentence, target), text in zip(pairs, texts, strict=True):
                tree = Tree.fromstring(text)
                assert sentence.split() == words(tree) and "-NONE-" not in sentence
                assert target.split() == linearize(tree, linearization)
                repaired = delinearize(target.split(), sentence.split(), tag_pos(tree),
                                       linearization)
                assert " ".join(linearize(repaired, linearization)) == target
                assert bracket_f1([tree], [repaired]) == 100.0
    assert load_pairs("wsj-parse", "train", str(wsj), linearization="tags")[2] == (
        "It was sold .", "(S (NP PRP )NP (VP VBD (VP VBN )VP )VP . )S")
    assert load_pairs("wsj-parse", "train", str(wsj))[2] == (  # xx: the default
        "It was sold .", "(S (NP XX )NP (VP XX (VP XX )VP )VP XX )S")


def test_tree_tokens_are_whole_pieces(wsj, tmp_path):
    pairs = load_pairs("wsj-parse", "train", str(wsj), linearization="tags")
    symbols = tree_symbols(pairs)
    assert "\u2581NN" in symbols and "\u2581(NP" in symbols and "\u2581)PRT" in symbols
    assert "\u2581XX" in tree_symbols(load_pairs("wsj-parse", "train", str(wsj), linearization="xx"))
    tokenizer = train_tokenizer("wsj-parse-test", 300,
                                (s for p in pairs for s in p), tmp_path / "cache",
                                symbols=symbols, hard_vocab_limit=False)
    assert tokenizer.vocab_size < 300  # a soft limit: the tiny treebank cannot fill it
    targets = [t for _, t in pairs]
    ids = tokenizer.encode(targets)
    assert [len(i) for i in ids] == [len(t.split()) for t in targets]  # one piece per token
    assert tokenizer.decode(ids) == targets


def test_word_targets_reuse_the_source_pieces(wsj, tmp_path):
    """With word targets only brackets are whole pieces; each word is split as in the source, so
    constrained decoding can copy the source's pieces (decoding.TreeConstraint)."""
    pairs = load_pairs("wsj-parse", "train", str(wsj), linearization="words")
    symbols = tree_symbols(pairs, "words")
    assert "\u2581(NP" in symbols and not {"\u2581sold", "\u2581It"} & set(symbols)
    tokenizer = train_tokenizer("wsj-parse-words", 300, (s for p in pairs for s in p),
                                tmp_path / "cache", symbols=symbols, hard_vocab_limit=False)
    for sentence, target in pairs:
        src, tgt = tokenizer.encode([sentence, target])
        assert [i for i in tgt if tokenizer.piece(i) not in symbols] == src
    # Each linearization and each treebank is its own content, so its own vocabulary.
    names = {CorpusSource("wsj-parse", str(wsj), linearization=lin).tokenizer_name()
             for lin in ("words", "tags", "xx")}
    assert len(names) == 3


def test_missing_treebank_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setattr(nltk.data, "path", [])
    monkeypatch.setenv("NLTK_DATA", str(tmp_path / "nltk"))
    from reproduce.data import treebank_trees

    treebank_trees.cache_clear()
    with pytest.raises(DataError, match=rf"NLTK_DATA={tmp_path / 'nltk'}.*--treebank") as e:
        load_pairs("wsj-parse", "train")
    assert "\n" not in str(e.value)
    with pytest.raises(DataError, match=rf"treebank '{tmp_path / 'none'}' is not a directory"):
        load_pairs("wsj-parse", "dev", str(tmp_path / "none"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"no wsj_\*\.mrg files for sections 22 under"):
        load_pairs("wsj-parse", "dev", str(tmp_path / "empty"))


def test_semi_supervised_corpus_needs_silver_trees(wsj, tmp_path):
    assert missing_input("wsj-parse", None) is None
    assert "--silver" in missing_input("wsj-parse-semi", None)
    with pytest.raises(DataError, match="--silver"):
        load_pairs("wsj-parse-semi", "train", str(wsj))
    silver = tmp_path / "silver.txt"
    silver.write_text("(S (NP (NNS Cats)) (VP (VBP sleep)) (. .))\n"
                      "(S (NP (PRP We)) (VP (VBD left)))\n")
    train = load_pairs("wsj-parse-semi", "train", str(wsj), str(silver), "tags")
    assert len(train) == len(TRAIN) + 2 and train[-1] == ("We left", "(S (NP PRP )NP (VP VBD )VP )S")
    assert len(load_pairs("wsj-parse-semi", "dev", str(wsj), str(silver))) == len(DEV)


# --- the CLI, end to end -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """The real CLI in this process (seconds saved on imports), on its own results and runs."""
    root = tmp_path_factory.mktemp("table4")
    with pytest.MonkeyPatch.context() as mp:
        for name in ("RESULTS", "RUNS", "CACHE"):
            mp.setenv(f"REPRODUCE_{name}", str(root / name.lower()))
        mp.setattr(nltk.data, "path", list(nltk.data.path))
        wsj = write_wsj(root / "wsj")
        yield root, lambda *args: main(["table4", "--scale", "smoke", "--treebank", str(wsj), *args])


def test_smoke_run_writes_a_record_with_f1_and_renders_the_table(cli):
    root, run = cli
    assert run("--variant", "wsj_only") == 0
    path = root / "results" / "table4" / "table4-wsj_only-smoke-seed0-ptb.json"
    r = json.loads(path.read_text())
    assert r["split"] == "test" and r["scale"] == "smoke" and r["treebank"]["kind"] == "wsj"
    m = r["metrics"]
    for key in ("dev_f1", "dev_precision", "dev_recall", "test_f1", "test_precision", "test_recall"):
        assert 0.0 <= m[key] <= 100.0
    assert m["train_steps"] == r["config"]["train"]["train_steps"] > 0
    assert r["evalb"]["test"]["sentences"] == len(TEST) and r["evalb"]["dev"]["kind"] == "evalb-collins"
    assert r["evalb"]["test"]["gold_brackets"] == 10  # S NP VP NP PP NP + S NP VP NP, "." deleted
    assert r["config"]["data"]["data_dir"] and r["data"]["vocab_size"] <= 300
    assert r["commit"]["sha"] and r["hardware"]["cpu"] and r["wall_seconds"] > 0
    assert r["command"].startswith("python -m reproduce table4 --scale smoke --treebank")
    table = (root / "results" / "table4.md").read_text()
    assert "| Dyer et al. (2016) | generative | 93.3 |" in table
    assert (f"| Transformer (4 layers), ours, scale `smoke`, WSJ, untuned, POS-tag targets, one "
            f"token a word, weights chosen on dev | WSJ only, discriminative | {m['test_f1']:.1f} "
            f"(section 23; dev {m['dev_f1']:.1f}) |") in table
    assert "| Transformer (4 layers), ours | semi-supervised | not run (no semi-supervised " in table
    hours = r["metrics"]["train_seconds"] / 3600
    assert f"Cost: {hours:.1f} worker-hours of training for 1 runs on {r['hardware']['cpu']}" in table


def test_smoke_run_chooses_its_weights_on_dev_and_keeps_what_rescores_them(cli):
    """The scale's last 2 checkpoints and their average each parsed the dev split; the record
    keeps every candidate's dev F1, scores test on the best, and keeps every output, from which
    F1 and the place counts come back equal (``parses.rescore``)."""
    root, run = cli
    path = root / "results" / "table4" / "table4-wsj_only-smoke-seed0-ptb.json"
    if not path.exists():
        assert run("--variant", "wsj_only") == 0
    r = json.loads(path.read_text())
    pick = r["pick"]
    scores = {c["weights"]: c["dev_f1"] for c in pick["candidates"]}
    assert list(scores) == ["step 20", "step 30", "average of steps 20, 30"]
    assert scores[pick["chosen"]] == max(scores.values()) == r["metrics"]["dev_f1"]
    chosen = next(c for c in pick["candidates"] if c["weights"] == pick["chosen"])
    assert r["averaged_checkpoints"] == chosen["checkpoints"]
    assert r["data"]["vocabulary"]["kind"] == "words" and r["data"]["vocabulary"]["one_token"] == 100
    folder = root / "results" / "table4"
    for split in ("dev", "test"):
        gold = treebank_trees(split, str(root / "wsj"))
        again = parses.rescore(folder, r, split, gold)
        kept = r["evalb"][split]
        assert again is not None and again["f1"] == kept["f1"] and again["place"] == kept["place"]
        assert kept["place"]["words"] == sum(len(words(t)) for t in gold)
    assert "Where the parser loses its place (dev)" in (root / "results" / "table4.md").read_text()
    lines, ok = parses.kept_lines(folder, r)  # what verify prints
    assert ok and len(lines) == 2 and "rescored to the recorded F1" in lines[0]
    r["evalb"]["test"]["place"]["inserted"] += 1
    lines, ok = parses.kept_lines(folder, r)
    assert not ok and lines[1].endswith("DIFFERENT from the record: place")


def test_running_again_skips_and_semi_supervised_is_not_run(cli, caplog):
    root, run = cli
    path = root / "results" / "table4" / "table4-wsj_only-smoke-seed0-ptb.json"
    before = path.read_bytes()
    with caplog.at_level(logging.INFO, logger="reproduce"):
        assert run() == 0  # both rows: wsj_only is done, semi_supervised has no corpus
    assert "finished earlier" in caplog.text
    assert path.read_bytes() == before
    assert sorted(p.name for p in (root / "results" / "table4").glob("*.json")) == [path.name]


def test_tuning_persists_its_study_and_resumes_it(cli):
    import optuna

    root, run = cli
    assert run("--variant", "wsj_only", "--tune", "--trials", "2") == 0
    storage = f"sqlite:///{root / 'runs' / 'optuna.db'}"
    study = optuna.load_study(study_name="table4-wsj_only-smoke-seed0-ptb", storage=storage)
    assert len(study.trials) == 2
    assert set(study.trials[0].params) == {"p_drop", "p_attn", "lr_scale", "beam"}
    tuned = [json.loads(p.read_text()) for p in (root / "results" / "table4").glob("*tuned-*.json")]
    assert len(tuned) == 1
    t = tuned[0]["tuning"]
    assert (t["n_trials"], t["storage"], t["metric"]) == (2, storage, "dev_f1")
    assert tuned[0]["config"]["decode"]["beam"] == t["best_params"]["beam"]
    assert tuned[0]["config"]["model"]["p_drop"] == pytest.approx(t["best_params"]["p_drop"])
    assert run("--variant", "wsj_only", "--tune", "--trials", "1") == 0
    assert len(optuna.load_study(study_name=t["study"], storage=storage).trials) == 3
    table = (root / "results" / "table4.md").read_text()
    assert "tuned on dev (" in table and "optuna study `table4-wsj_only-smoke-seed0-ptb`" in table


def test_trials_are_pruned_on_dev_loss_in_the_studys_direction():
    from types import SimpleNamespace

    import optuna
    import torch

    from reproduce.train.tuning import PruneOnDevLoss, with_settings

    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=-1.0))
    trial = study.ask()
    callback = PruneOnDevLoss(trial, "maximize")
    trainer = SimpleNamespace(sanity_checking=False, state=SimpleNamespace(fn="fit"), global_step=10,
                              callback_metrics={"dev/nll": torch.tensor(0.5)})
    callback.on_validation_end(trainer, None)  # -0.5 is above the threshold: carry on
    trainer.global_step, trainer.callback_metrics["dev/nll"] = 20, torch.tensor(2.0)
    with pytest.raises(optuna.TrialPruned, match="dev NLL 2.000 at step 20"):
        callback.on_validation_end(trainer, None)
    assert study.trials[0].intermediate_values == {10: -0.5, 20: -2.0}
    run = load_spec("table4").plan(["wsj_only"], "smoke", [0])[0]
    tuned = with_settings(run, {"p_drop": 0.3, "beam": 1})
    assert tuned.run_id.startswith("table4-wsj_only-smoke-seed0-tuned-")
    assert (tuned.config.model.p_drop, tuned.config.decode.beam) == (0.3, 1)
    assert with_settings(run, {"beam": 1, "p_drop": 0.3}).run_id == tuned.run_id


@pytest.mark.parametrize("args, message", [
    (["--treebank", "/nonexistent/wsj"], "--treebank '/nonexistent/wsj': no such file or folder"),
    (["--silver", "/nonexistent/trees"], "--silver '/nonexistent/trees': no such file or folder"),
    (["--variant", "wsj"], "unknown variant 'wsj'; valid variants: wsj_only, wsj_only_words, wsj_only_bpe, "
     "semi_supervised"),
    (["--tune", "--trials", "0"], "--trials 0: must be at least 1"),
    (["--tune", "--storage", "nosuchdb://x"], "--storage 'nosuchdb://x'"),
])
def test_bad_input_is_one_line_and_exit_2(cli, capsys, args, message):
    _, run = cli
    assert run(*args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_dry_run_prints_the_plan_tuning_and_what_cannot_run(monkeypatch, capsys):
    from reproduce.plan import step_probe as cost

    monkeypatch.setattr(cost, "measure_step_seconds", lambda config, tokens, **kw: 0.01)
    assert main(["table4", "--scale", "paper", "--dry-run", "--tune", "--trials", "5"]) == 0
    out = capsys.readouterr().out
    assert "table4-wsj_only-paper-seed0: overrides {} -> vocab_size=16000 N=4 d_model=1024" in out
    assert "not run: corpus 'wsj-parse-semi' needs a semi-supervised corpus: pass --silver" in out
    assert "tuning: 5 more trial(s) per run, maximising dev_f1 on dev" in out
    assert "beam: one of [4, 10, 21]" in out and "lr_scale: 0.25 .. 2 (log scale)" in out
    plan = [line for line in out.splitlines() if "tokens/step" in line]
    assert len(plan) == 1 and "100000 steps x 25000 tokens/step" in plan[0]


def test_render_without_records_shows_the_papers_table():
    table = render_table4(load_spec("table4"), [])
    assert "| Transformer (4 layers) | WSJ only, discriminative | 91.3 |" in table
    assert "| Transformer (4 layers), ours | WSJ only, discriminative | not run |" in table
    assert "No runs recorded yet." in table and "not comparable" in table


@pytest.mark.skipif(not treebank_sample_present(), reason="NLTK's treebank sample not found (set NLTK_DATA)")
def test_sample_pairs_have_the_documented_sizes():
    sizes = {split: len(load_pairs("wsj-parse", split)) for split in ("train", "dev", "test")}
    assert sizes == {"train": 3098, "dev": 420, "test": 396}


def test_constrained_decoding_re_evaluates_without_retraining_and_keeps_the_free_f1(cli, caplog):
    root, run = cli
    text = (Path(__file__).parents[2] / "sweeps" / "table4.yaml").read_text()
    smoke = "          pick_on_dev: 2, vocabulary: words}"
    assert smoke in text
    spec = root / "constrained.yaml"
    spec.write_text(text.replace(smoke, smoke[:-1] + ", constrained: true}"))
    path = root / "results" / "table4" / "table4-wsj_only-smoke-seed0-ptb.json"
    if not path.exists():
        assert run("--variant", "wsj_only") == 0
    before = json.loads(path.read_text())
    with caplog.at_level(logging.INFO, logger="reproduce"):
        assert run("--variant", "wsj_only", "--spec", str(spec)) == 0
    assert "checkpoints were made with another config" not in caplog.text  # resumed, not retrained
    r = json.loads(path.read_text())
    assert r["config"]["decode"]["constrained"] and r["resumed"]
    assert r["metrics"]["train_steps"] == before["metrics"]["train_steps"]
    assert r["evalb"]["test"]["well_formed"] == r["evalb"]["test"]["sentences"]
    assert 0.0 <= r["metrics"]["test_f1_free"] <= 100.0
    assert r["evalb"]["test"]["free"]["sentences"] == r["evalb"]["test"]["sentences"]
    assert list((root / "results" / "table4" / "superseded").glob(path.stem + ".*.json"))
    assert "(free: " in (root / "results" / "table4.md").read_text()
