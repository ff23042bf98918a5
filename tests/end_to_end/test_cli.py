"""The real CLI, end to end: bad specs and corpora, W&B's modes, README's test command. The rows
of Table 3 trained, skipped, rendered and resumed are in ``tests/end_to_end/test_first_steps.py``, on the row
docs/first-steps.md trains."""

import json
from pathlib import Path

import pytest

from tests import helpers
from tests.helpers import cli, cli_env

pytestmark = pytest.mark.slow


def test_bad_spec_file_names_file_and_key(tmp_path):
    env = cli_env(tmp_path)
    spec = tmp_path / "mine.yaml"
    spec.write_text("variants: {base: {set: {d_modle: 3}}}\n")
    out = cli(env, "table3", "--spec", str(spec), "--dry-run", check=False)
    assert out.returncode == 2
    assert "mine.yaml: variants.base.set: unknown config key 'd_modle'" in out.stderr


def test_missing_corpus_fails_cleanly(tmp_path):
    env = cli_env(tmp_path)
    spec = tmp_path / "local.yaml"
    spec.write_text(f"base: {{corpus: wmt14-en-de, data_dir: {tmp_path / 'nowhere'}}}\n"
                    "variants: {base: {}}\n")
    for dry in (["--dry-run"], []):  # the plan finds it too, not "~0 pairs in ~0 s"
        out = cli(env, "table3", "--spec", str(spec), "--scale", "smoke", *dry, check=False)
        assert out.returncode == 2 and "nowhere" in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "results" / "local.md").exists()  # no empty table before it fails


def test_repo_readme_and_ci_run_the_same_test_command():
    root = Path(__file__).resolve().parents[2]
    ci = (root / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in (root / "README.md").read_text()


def test_wandb_mode_disabled_trains_and_renders_without_wandb(tmp_path):
    env = {**cli_env(tmp_path), "WANDB_MODE": "disabled"}
    out = cli(env, "table3", "--variant", "base", "--scale", "smoke")
    record = json.loads((tmp_path / "results/table3/table3-base-smoke-seed0.json").read_text())
    assert record["wandb"] == {"id": None, "mode": "disabled", "dir": None, "url": None}
    assert "logged the table to W&B" not in out.stdout
    assert not list(tmp_path.rglob("wandb"))  # no run folder, for the run or the table
    refused = cli(env, "publish", "--table", "table3", check=False)
    assert refused.returncode != 0 and "WANDB_MODE=disabled" in refused.stderr


def test_wandb_mode_follows_wandb_s_own_switch(monkeypatch):
    from reproduce.util.tracking import wandb_mode

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for mode, key, want in ((None, None, "offline"), ("online", None, "offline"),
                            (None, "k", "online"), ("offline", "k", "offline"),
                            ("dryrun", "k", "offline"), ("disabled", "k", "disabled"),
                            ("disabled", None, "disabled")):
        for name, value in (("WANDB_MODE", mode), ("WANDB_API_KEY", key)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        assert wandb_mode() == want, (mode, key)


def test_a_bad_wandb_init_timeout_is_one_line_before_training(tmp_path):
    env = {**cli_env(tmp_path), "WANDB_MODE": "", "WANDB_API_KEY": "0123456789abcdef0123",
           "WANDB_INIT_TIMEOUT": "soon"}
    out = cli(env, "table3", "--variant", "base", "--scale", "smoke", check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "error: WANDB_INIT_TIMEOUT='soon': allowed values are seconds above 0 (how long an "
        "online run waits for W&B before logging offline)")
    assert not (tmp_path / "runs" / "table3").exists()


def test_a_flag_of_several_values_given_twice_keeps_both():
    """`--set a=1 --set b=2` (or --seeds, --scales, --cap twice) adds, as --variant does: the
    second does not drop the first without a word."""
    from reproduce.__main__ import build_parser

    parser = build_parser()
    table = parser.parse_args(["table3", "--set", "train.warmup_steps=5", "--set", "decode.beam=2",
                               "model.N=2", "--seeds", "1", "--seeds", "2"])
    assert (table.set, table.seeds) == (["train.warmup_steps=5", "decode.beam=2", "model.N=2"],
                                        [1, 2])
    assert parser.parse_args(["table3"]).seeds is None  # the default, 0, comes with the plan
    bench = parser.parse_args(["bench", "--scales", "cpu", "--scales", "smoke", "--cap", "base=5",
                               "--cap", "big=9", "--set", "N=1", "--set", "h=2"])
    assert (bench.scales, bench.cap, bench.set) == (["cpu", "smoke"], ["base=5", "big=9"],
                                                    ["N=1", "h=2"])


def test_a_cli_call_after_a_test_scored_bleu_in_its_own_process_is_still_forked(tmp_path):
    """What a test's own imports leave in the environment must not turn every later CLI call
    of its pytest worker into a fresh interpreter (~5 s of imports each): scoring tokenized
    BLEU imports sacremoses, whose joblib sets KMP_INIT_AT_FORK. 57 CLI calls of one suite
    were fresh for it."""
    from reproduce.paper.bleu import tokenized_bleu

    tokenized_bleu(["ein kleiner Test ."], ["ein kleiner Test ."], "de")
    env = cli_env(tmp_path)
    assert helpers.forkable(env), helpers.differing(env)


_ENDING = '''
import atexit, sys, threading, time
from pathlib import Path
import reproduce.__main__ as cli
here = Path(sys.argv[1])

def main():
    def late():  # a thread that is not a daemon: the exit waits for it
        time.sleep(0.5)
        (here / "thread").write_text("joined")
    threading.Thread(target=late).start()
    atexit.register(lambda: (here / "atexit").write_text("ran"))
    print("unflushed", end="")  # no newline: still in stdout's buffer at the end
    return int(sys.argv[2]) if sys.argv[2].isdigit() else exec(sys.argv[2])

cli.main = main
cli.run()
'''


@pytest.mark.parametrize("ending, code", [("3", 3), ("raise SystemExit('no such thing')", 1),
                                          ("raise SystemExit(None)", 0)])
def test_the_cli_ends_as_python_would_less_the_teardown(tmp_path, ending, code):
    """``reproduce.__main__.run`` skips the modules' teardown (1.2 s of a core each exit), and
    nothing else of Python's exit: the status, threads joined, atexit handlers, buffered output."""
    import subprocess
    import sys

    script = tmp_path / "ending.py"
    script.write_text(_ENDING)
    out = subprocess.run([sys.executable, str(script), str(tmp_path), ending],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == code, out.stderr
    assert out.stdout == "unflushed"
    assert (tmp_path / "thread").read_text() == "joined"
    assert (tmp_path / "atexit").read_text() == "ran"
    if code == 1:
        assert out.stderr.strip() == "no such thing"


def test_what_native_code_printed_is_not_lost_at_the_end(tmp_path):
    """C's stdio buffers, which Python's exit flushes through C's ``exit()``: a library's
    ``printf`` into a stdout that is a pipe or a file is still written."""
    import os
    import subprocess
    import sys

    script = tmp_path / "native.py"
    script.write_text("import ctypes\nimport reproduce.__main__ as cli\n"
                      "cli.main = lambda: ctypes.CDLL(None).printf(b'native') and 0\ncli.run()\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # C's buffers too
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, env=env)
    assert (out.returncode, out.stdout) == (0, "native"), out.stderr


def test_a_profiler_around_the_cli_still_writes_its_profile(tmp_path):
    """``python -m cProfile -o F`` around the CLI (``benchmarks/paper_run.py --profile``): the
    CLI ends by returning to the profiler, which then writes ``F``; ``os._exit`` would lose it."""
    import pstats
    import subprocess
    import sys

    script, stats = tmp_path / "ending.py", tmp_path / "cli.prof"
    script.write_text(_ENDING)
    out = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(stats), str(script),
                          str(tmp_path), "3"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr  # cProfile's own status, as without reproduce
    assert pstats.Stats(str(stats)).total_calls > 0
    assert (tmp_path / "thread").read_text() == "joined"
