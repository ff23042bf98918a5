"""train.compile: off, on, or auto (a timed step, compiled against eager, decides where compiling
pays over the run); a compiler failure trains eager with one line; each choice in the record."""

import json
import os

import pytest
import torch

from reproduce.config import ConfigError, parse_sets
from reproduce.records.sweep import load_spec
from reproduce.train import compiling
from tests.helpers import cli, cli_env, inject


@pytest.fixture
def config():
    return load_spec("table3").resolve("base", "smoke").overrides(compile="auto")


def timings(eager, compiled, compile_seconds):
    return lambda c, tokens, precision, device: {"eager": eager, "compiled": compiled,
                                                 "compile_seconds": compile_seconds}


@pytest.mark.parametrize("eager, compiled, cost, steps, chosen", [
    (1.0, 0.5, 60.0, 1000, True),    # 2x faster; saves 500 s against 60 s of compiling
    (1.0, 0.95, 1.0, 10**6, False),  # a near tie stays eager (margin 1.1x)
    (1.0, 0.5, 60.0, 100, False),    # 2x faster, but 100 steps save 50 s: not worth 60 s
    (0.8, 1.0, 60.0, 10**6, False),  # the 2-core CPU: compiled slower
])
def test_compiling_is_taken_where_it_is_faster_and_pays_over_the_run(
        config, tmp_path, eager, compiled, cost, steps, chosen):
    got, how = compiling.choose(config, 1024, steps, "32-true", "cpu", tmp_path / "c.json",
                                timer=timings(eager, compiled, cost))
    assert got is chosen and how["chosen"] is chosen and not how["cached"]
    assert how["seconds"]["eager"] == eager and how["seconds"]["compiled"] == compiled
    assert how["micro_steps"] == steps and how["how"].endswith(": eager") is not chosen


def test_the_timings_are_cached_and_each_run_decides_by_its_own_steps(config, tmp_path):
    cache = tmp_path / "c.json"
    compiling.choose(config, 1024, 1000, "32-true", "cpu", cache, timer=timings(1.0, 0.5, 60.0))

    def never(*args):
        raise AssertionError("timed again")

    got, how = compiling.choose(config, 1024, 1000, "32-true", "cpu", cache, timer=never)
    assert got and how["cached"]
    got, how = compiling.choose(config, 1024, 50, "32-true", "cpu", cache, timer=never)
    assert not got and how["cached"]  # the same timings, too short a run to pay
    # Another precision is another entry, timed afresh.
    compiling.choose(config, 1024, 1000, "bf16-mixed", "cpu", cache, timer=timings(1, 1, 1))
    assert len(json.loads(cache.read_text())) == 2


def test_a_compiler_failure_while_timing_is_eager_in_one_line(config, tmp_path):
    def fails(*args):
        raise RuntimeError("backend exploded\nat length")

    got, how = compiling.choose(config, 1024, 10**6, "32-true", "cpu", tmp_path / "c.json",
                                timer=fails)
    assert not got and how["how"] == ("torch.compile failed while timing (RuntimeError: backend "
                                      "exploded): eager")


def test_a_set_value_is_taken_as_it_is_and_booleans_mean_on_and_off(config):
    for asked, on in (("on", True), ("off", False)):
        got, how = compiling.choose(config.overrides(compile=asked), 1024, 10, "32-true", "cpu",
                                    None, timer=None)
        assert got is on and how == {"asked": asked, "how": "set in the config"}
    # YAML reads on/off/true as booleans; records written before "auto" hold booleans
    assert parse_sets(["train.compile=on", "compile=false"]) == {"compile": False}
    assert config.overrides(compile=True).train.compile == "on"
    assert config.overrides(**parse_sets(["train.compile=off"])).train.compile == "off"
    with pytest.raises(ConfigError, match="train.compile = 'sometimes': allowed values are off, "
                                          "on, auto"):
        config.overrides(compile="sometimes")


def test_a_torch_older_than_the_fast_paths_oldest_trains_eager_and_says_why(config, monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.10.1+cu128")
    for asked in ("on", "auto"):
        got, how = compiling.choose(config.overrides(compile=asked), 1024, 10**6, "32-true",
                                    "cpu", None, timer=timings(1.0, 0.1, 1.0))
        assert got is False and how == {"asked": asked, "how": (
            "torch 2.10.1+cu128 is older than 2.11, the oldest the fast path has trained on: "
            "eager")}
    monkeypatch.setattr(torch, "__version__", "2.11.0")
    assert compiling.choose(config.overrides(compile="on"), 1024, 10, "32-true", "cpu", None)[0]


def test_a_real_timing_of_eager_and_compiled():
    from reproduce.train.step_time import seconds_compiled

    small = load_spec("table3").resolve("base", "smoke").overrides(N=1)
    seconds = seconds_compiled(small, 256, "32-true", rounds=1)
    assert set(seconds) == {"eager", "compiled", "compile_seconds"}
    assert seconds["eager"] > 0 and seconds["compiled"] > 0 and seconds["compile_seconds"] >= 0


def test_the_timer_gives_each_timed_step_a_batch_shape_new_to_the_compiler(monkeypatch):
    """A compiled step that recompiles on every new shape must look as slow as it is: after the
    warm-up, each timed step of ``auto``'s timer is on a shape the compiled loss has not seen, in
    another class modulo 8 (a kernel alignment guard), as a run's token-count batches come."""
    from reproduce.train.step_time import seconds_compiled

    seen: list[tuple[int, ...]] = []

    def recording_compile(fn, **options):
        assert options.get("dynamic") is True  # a run's batches change shape every step
        def compiled(model, batch, *args):
            seen.append(tuple(batch["tgt_out"].shape))
            return fn(model, batch, *args)
        return compiled

    monkeypatch.setattr(torch, "compile", recording_compile)
    small = load_spec("table3").resolve("base", "smoke").overrides(N=1)
    seconds_compiled(small, 256, "32-true", rounds=3)
    assert len(seen) == 4 and len(set(seen)) == 4, seen
    assert len({shape[1] % 8 for shape in seen}) == 4, seen


COMPILER_FAILS = '''
import torch

class BackendCompilerFailed(RuntimeError):
    pass

BackendCompilerFailed.__module__ = "torch._dynamo.exc"  # where torch.compile's errors come from

def failing_compile(fn, *args, **kwargs):
    def compiled(*a, **k):
        raise BackendCompilerFailed("injected: inductor failed\\ntraceback follows")
    return compiled

torch.compile = failing_compile

import reproduce.train.step_time as step_time
step_time.seconds_compiled = lambda c, tokens, precision, device: {
    "eager": 1.0, "compiled": 0.25, "compile_seconds": 1.0}

import time
import reproduce.data.module as module
mapped = module.encoded_corpus

def slow_encoded_corpus(*args, **kwargs):  # 2 s more to map (or encode) the corpus
    time.sleep(2)
    return mapped(*args, **kwargs)

module.encoded_corpus = slow_encoded_corpus
'''


def test_auto_decides_records_its_timings_and_trains_eager_when_the_compiler_fails(tmp_path):
    """Through the CLI: auto times (a timer saying compiled is 4x faster), takes compiling, the
    compiler fails on the first training step (injected), training goes on eager with one line,
    and the record says all of it, with the timing as a phase of its own (and the corpus mapped in
    the data phase, not in fit's)."""
    env = inject(cli_env(tmp_path), tmp_path / "inject", COMPILER_FAILS)
    out = cli(env, "table3", "--variant", "base", "--scale", "smoke", "--set", "train.compile=auto")
    said = out.stdout + out.stderr
    assert "compile auto -> on, for table3's base at `smoke` (compiled 4.00x eager" in said
    assert said.count("torch.compile failed (step 0: BackendCompilerFailed: injected: "
                            "inductor failed); training goes on eager") == 1
    [path] = (tmp_path / "results" / "table3").glob("*.json")
    r = json.loads(path.read_text())
    assert r["compile"] is False and r["config"]["train"]["compile"] == "auto"
    choice = r["compile_choice"]
    assert choice["chosen"] is True and choice["seconds"]["compiled"] == 0.25
    assert choice["failed_in_training"].startswith("step 0: BackendCompilerFailed")
    assert list(r["phases"]) == ["compile_choice", "data", "fit", "average", "dev_ppl", "decode"]
    assert r["phases"]["data"] >= 2  # mapping (or encoding) the corpus is the data phase's
    assert r["metrics"]["train_steps"] == 30  # every step trained, eager


def test_an_error_of_the_computation_itself_is_not_taken_for_a_compiler_failure(monkeypatch):
    from reproduce.speed import inputs as bench_inputs
    from reproduce.speed.training import lightning_loop
    from reproduce.train.lit import TranslationModule

    def compiled_that_fails(fn, **options):
        def compiled(*args, **kwargs):
            raise ValueError("not the compiler's")
        return compiled

    monkeypatch.setattr(torch, "compile", compiled_that_fails)
    config = load_spec("table3").resolve("base", "smoke").overrides(N=1, compile="on")
    batches = bench_inputs.synthetic_batches(config.model.vocab_size, 256, 1, 32, seed=0)
    with pytest.raises(ValueError, match="not the compiler's"):
        lightning_loop(TranslationModule(config.to_dict()), "32-true")(batches)


def test_the_paper_scale_times_compiling_and_the_others_stay_eager():
    for table, variant in (("table2", "base-en-de"), ("table3", "base"), ("table2", "big-en-fr")):
        spec = load_spec(table)
        assert spec.resolve(variant, "paper").train.compile == "auto"
        assert spec.resolve(variant, "cpu").train.compile == "off"
        assert spec.resolve(variant, "smoke").train.compile == "off"


TIMER_COUNTS = '''
import os
import reproduce.train.step_time as step_time

def timer(c, tokens, precision, device):
    with open(os.environ["REPRODUCE_TEST_TIMED_LOG"], "a") as f:
        f.write(f"{os.getpid()} h={c.model.h} tokens={tokens}\\n")
    return {"eager": 1.0, "compiled": 0.9, "compile_seconds": 5.0}

step_time.seconds_compiled = timer
'''


def test_two_ranks_read_the_timing_of_their_tables_base_made_once_before_they_start(tmp_path):
    """--devices 2 on a variant of another shape than base (A1: one head): the sweep's process
    times the table's base once, on one rank's micro-batch; both ranks read that and decide as
    it did, without timing their own model."""
    log = tmp_path / "timed.log"
    env = {**inject(cli_env(tmp_path, threads=2), tmp_path / "inject", TIMER_COUNTS),
           "REPRODUCE_TEST_TIMED_LOG": str(log)}
    out = cli(env, "table3", "--variant", "A1", "--scale", "smoke", "--devices", "2", "--set",
              "train.compile=auto")
    [timed] = log.read_text().splitlines()  # once, by the sweep's process, of base (8 heads)
    assert "h=8 tokens=256" in timed
    assert "compile auto -> off, for table3's base at `smoke` (cached: compiled 1.11x" in \
        out.stdout + out.stderr
    [path] = (tmp_path / "results" / "table3").glob("*.json")
    r = json.loads(path.read_text())
    assert r["compile"] is False and r["compile_choice"]["cached"] is True
    assert r["compile_choice"]["seconds"]["timed_model"] == "table3's base at `smoke`"


def test_compiled_kernels_are_kept_in_the_projects_cache_unless_a_user_chose_a_folder(
        tmp_path, monkeypatch):
    """Without ``TORCHINDUCTOR_CACHE_DIR``, or with torch's own default (which importing its
    compiler sets), kernels go to ``inductor/`` in the project's cache, a cluster's shared
    storage; a folder a user chose is kept. (That the next process loads them instead of
    compiling is torch's: measured in step_time.use_compile_cache's docstring.)"""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from reproduce.train.step_time import INDUCTOR_CACHE_ENV, use_compile_cache

    monkeypatch.setenv("REPRODUCE_CACHE", str(tmp_path / "cache"))
    for before in (None, default_cache_dir()):
        if before is None:
            monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
        else:
            monkeypatch.setenv(INDUCTOR_CACHE_ENV, before)
        assert use_compile_cache() == tmp_path / "cache" / "inductor"
        assert os.environ[INDUCTOR_CACHE_ENV] == str(tmp_path / "cache" / "inductor")
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(tmp_path / "mine"))
    assert use_compile_cache() == tmp_path / "mine" and (tmp_path / "mine").is_dir()


@pytest.mark.parametrize("graphs", [False, True])
def test_cuda_graphs_ask_inductor_for_them_and_mark_each_call_a_new_step(monkeypatch, graphs):
    """``train.cuda_graphs`` reaches torch.compile as inductor's ``triton.cudagraphs`` (beside
    ``fallback_random``, as ``mode="reduce-overhead"`` cannot be), and each call of the compiled
    loss starts a new step of the cudagraph trees (a step's micro-batches call it more than once
    before the backward of the last); off, nothing is marked. What a GPU does with them is not
    measured here."""
    from reproduce.train import step_time

    asked, marks = {}, []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: asked.update(kw) or fn)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    run = step_time.compiled_fast(lambda x: x + 1, cuda_graphs=graphs)
    assert run(1) == 2 and run(2) == 3
    assert asked["options"] == {"fallback_random": True, "triton.cudagraphs": graphs}
    assert asked["dynamic"] is True and asked["fullgraph"] is True
    assert len(marks) == (2 if graphs else 0)
    assert parse_sets(["train.cuda_graphs=true"]) == {"cuda_graphs": True}


def test_cuda_graphs_that_fail_give_way_to_the_compiled_path_not_to_eager(monkeypatch):
    """A forced capture failure (what CUDA graphs do with two backward passes, say): the step is
    taken compiled without them, said once, and the run stays on the fast path."""
    from reproduce.speed import inputs as bench_inputs
    from reproduce.speed.training import lightning_loop
    from reproduce.train.lit import TranslationModule

    class CaptureFailed(RuntimeError):
        pass

    CaptureFailed.__module__ = "torch._inductor.cudagraph_trees"
    asked = []

    def compile_(fn, **kwargs):
        graphs = kwargs.get("options", {}).get("triton.cudagraphs")
        asked.append(graphs)

        def compiled(*args, **kw):
            if graphs:
                raise CaptureFailed("operation not permitted when stream is capturing")
            return fn(*args, **kw)
        return compiled

    monkeypatch.setattr(torch, "compile", compile_)
    config = load_spec("table3").resolve("base", "smoke").overrides(N=1, compile="on",
                                                                    cuda_graphs=True)
    module = TranslationModule(config.to_dict())
    batches = bench_inputs.synthetic_batches(config.model.vocab_size, 256, 1, 32, seed=0)
    lightning_loop(module, "32-true")(batches)
    assert asked == [True, False] and module.fast and module.compile_failed is None
    assert module.graphs_failed.startswith("step 0: CaptureFailed: operation not permitted")


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_cuda_graphs_that_fail_in_the_backward_give_way_and_the_pass_is_taken_again(monkeypatch,
                                                                                    precision):
    """A capture failure in the backward (pytorch/pytorch#169545's second backward, say), where
    the forward's try cannot see it: the pass is taken again compiled without CUDA graphs, with
    the same dropout masks and under the same autocast, so the weights are those of a run that
    never had them."""
    from reproduce.speed import inputs as bench_inputs
    from reproduce.speed.training import lightning_loop
    from reproduce.train.lit import TranslationModule

    class CaptureFailed(RuntimeError):
        pass

    CaptureFailed.__module__ = "torch._inductor.cudagraph_trees"

    class FailsBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            raise CaptureFailed("captured a second backward while capturing")

    def compile_(fn, **kwargs):
        graphs = kwargs.get("options", {}).get("triton.cudagraphs")

        def compiled(*args, **kw):
            smoothed, nll, n = fn(*args, **kw)
            return (FailsBackward.apply(smoothed) if graphs else smoothed), nll, n
        return compiled

    monkeypatch.setattr(torch, "compile", compile_)
    config = load_spec("table3").resolve("base", "smoke").overrides(N=1, compile="on")
    batches = bench_inputs.synthetic_batches(config.model.vocab_size, 256, 3, 32, seed=0)
    weights = {}
    for graphs in (True, False):
        torch.manual_seed(0)
        module = TranslationModule(config.overrides(cuda_graphs=graphs).to_dict())
        lightning_loop(module, precision)(batches)
        weights[graphs] = module.model.state_dict()
        assert module.fast and module.compile_failed is None
        assert (module.graphs_failed or "").startswith(
            "step 0: CaptureFailed: captured a second" if graphs else "")
    for name, value in weights[False].items():
        assert torch.equal(weights[True][name], value), name


@pytest.mark.parametrize("sets, why", [
    ({"batch_shapes": 0}, "exact batch widths (train.batch_shapes 0) records a CUDA graph"),
    ({"batch_shapes": 8, "batch_tokens": 4096, "device_batch_tokens": 2048},
     "with 2 passes a step (train.device_batch_tokens 2048 of 4096) fails at the second backward"),
])
def test_cuda_graphs_are_refused_in_one_line_where_they_are_unsafe(sets, why):
    from reproduce.train.compiling import cuda_graphs_refusal
    from reproduce.train.devices import Layout

    config = load_spec("table3").resolve("base", "smoke").overrides(cuda_graphs=True, **sets)
    gpu = Layout(accelerator="gpu")
    assert why in cuda_graphs_refusal(config, True, gpu)
    assert cuda_graphs_refusal(config, False, gpu) is None  # eager: they do nothing
    assert cuda_graphs_refusal(config, True, Layout()) is None  # a CPU: nothing either
    fine = config.overrides(batch_shapes=8, batch_tokens=2048, device_batch_tokens=0)
    assert cuda_graphs_refusal(fine, True, gpu) is None
    assert "on 2 devices: a pass whose CUDA graph fails in the backward cannot be taken again" in (
        cuda_graphs_refusal(fine, True, Layout(accelerator="gpu", devices=2)))
