"""Nothing lost, nothing misleading, through the real CLI at `smoke`: a run killed at any moment
and resumed writes the metrics of one never interrupted; damaged checkpoints and records are set
aside in one line; bad data and bad specs are refused in one line naming what is wrong."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from reproduce.records import checkpoints, claims, disk
from reproduce.records.sweep import load_spec
from tests.helpers import WANDB_OFFLINE, cli, cli_env, inject, start

pytestmark = pytest.mark.slow

RUN = "mine-base-smoke-seed0"


def _env(root: Path) -> dict[str, str]:
    return cli_env(root, threads=1)


def _spec(path: Path, base: dict | None = None, variants: dict | None = None) -> Path:
    """A spec of table `mine`; smoke multiplies train_steps by 0.0003 (100000 -> 30 steps). By
    default its runs average their last 3 checkpoints (Table 2's way): the step files hold weights
    alone and runs resume from last.ckpt."""
    path.parent.mkdir(parents=True, exist_ok=True)
    base = {"average_last": 3} if base is None else base
    path.write_text("table: mine\nbase: " + json.dumps(base) + "\nvariants: "
                    + json.dumps(variants or {"base": {}}) + "\n")
    return path


def _record(root: Path, run: str = RUN) -> dict:
    return json.loads((root / "results" / "mine" / f"{run}.json").read_text())


def _newest_step(work: Path) -> int:
    steps = [int(m.group(1)) for p in (work / "checkpoints").glob("step*.ckpt")
             if (m := re.fullmatch(r"step(\d+)\.ckpt", p.name))]
    return max(steps, default=-1)


def _kill_after(env, args, work: Path, step: int) -> None:
    """Start the command and kill -9 its whole process group once a checkpoint of ``step`` or
    later is on disk (the kill lands a little after: wherever it lands, resuming must not tell)."""
    proc = start(env, *args, new_session=True)
    deadline = time.time() + 300
    while _newest_step(work) < step:
        if proc.poll() is not None:
            raise AssertionError(f"finished before step {step}: {proc.communicate()[1]}")
        assert time.time() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    """One uninterrupted run of the default spec: the reference several tests compare with (they
    copy it before changing anything)."""
    root = tmp_path_factory.mktemp("clean")
    cli({**_env(root), **WANDB_OFFLINE}, "table3", "--spec", str(_spec(root / "mine.yaml")),
        "--scale", "smoke")
    return root


def _copy(clean: Path, to: Path) -> Path:
    shutil.copytree(clean, to, dirs_exist_ok=True)
    return to


def _comparable(record: dict) -> dict:
    m = record["metrics"]
    keep = ("dev_ppl", "dev_nll", "train_sample_nll", "dev_bleu", "test_bleu", "dev_bleu_tokenized",
            "test_bleu_tokenized", "train_steps")
    return {"metrics": {k: m[k] for k in keep},
            "curve": {k: [[p[0], p[2]] for p in v] for k, v in record["curve"].items()},
            "outputs": [e["output"] for e in record["bleu"]["test"]["examples"]]}


@pytest.mark.parametrize("base", [
    None,  # the default spec: the `clean` run's
    # 2 micro-batches a step, a checkpoint every 0.12 s: saves come due between micro-batches
    {"device_batch_tokens": 256, "ckpt_every_minutes": 0.002},
], ids=["every-5-steps", "accumulated-time-based"])
def test_a_run_killed_at_several_moments_and_resumed_equals_one_never_interrupted(tmp_path, base,
                                                                                 clean):
    """Dropout on (the default p_drop), three kills: early, mid-epoch, during evaluation."""
    spec = _spec(tmp_path / "mine.yaml", base)
    args = ["table3", "--spec", str(spec), "--scale", "smoke"]
    broken = tmp_path / "broken"
    if base:  # another config: its own uninterrupted run
        clean = tmp_path / "clean"
        cli(_env(clean), *args)
    work = broken / "runs" / "mine" / RUN
    for step in (4, 12, 30):  # 30: the last step, so the kill lands in evaluation
        _kill_after(_env(broken), args, work, step)
        assert not (broken / "results" / "mine" / f"{RUN}.json").exists()
    cli(_env(broken), *args)
    resumed = _record(broken)
    assert resumed["resumed"]
    assert _comparable(resumed) == _comparable(_record(clean))
    # Dev every val_every_steps (10 at smoke) optimizer steps, however many micro-batches each.
    assert [p[0] for p in resumed["curve"]["dev_ppl"]] == [10, 20, 30]
    if base is None:  # averaging 3: step files of weights alone, a full last.ckpt, sized as planned
        assert len(resumed["averaged_checkpoints"]) == 3
        need = disk.need(load_spec(str(spec)).resolve("base", "smoke"))
        assert need.weights_only
        steps = list((work / "checkpoints").glob("step*.ckpt"))
        last = work / "checkpoints" / "last.ckpt"
        assert steps and all(checkpoints.weights_only(p) for p in steps)
        assert not checkpoints.weights_only(last)
        for path, counted in [(last, need.full)] + [(p, need.step) for p in steps]:
            assert counted - disk.OVERHEAD <= path.stat().st_size <= counted, path


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage", ["last", "all"])
def test_a_damaged_checkpoint_is_set_aside_and_the_run_resumes_from_a_readable_one(tmp_path,
                                                                                   damage, clean):
    spec = _spec(tmp_path / "mine.yaml")
    args = ["table3", "--spec", str(spec), "--scale", "smoke"]
    broken = tmp_path / "broken"
    work = broken / "runs" / "mine" / RUN
    _kill_after(_env(broken), args, work, 12)
    folder = work / "checkpoints"
    hit = [folder / "last.ckpt"] + (list(folder.glob("step*.ckpt")) if damage == "all" else [])
    for path in hit:
        _truncate(path)
    out = cli(_env(broken), *args)
    assert "Traceback" not in out.stderr + out.stdout
    for path in hit:
        assert f"{path}: not a readable checkpoint" in out.stdout
    assert sorted(p.name.split(".ckpt")[0] for p in (folder / "damaged").iterdir()) == \
        sorted(p.stem for p in hit)
    record = _record(broken)
    # The step files hold weights alone (for averaging): with last.ckpt damaged, the run starts
    # over (with one checkpoint averaged, the step file beside it resumes: test_checkpoints).
    assert not record["resumed"]
    # From nothing, the run still ends where the clean one did.
    assert _comparable(record) == _comparable(_record(clean))


def test_a_damaged_record_is_named_set_aside_and_its_run_redone(tmp_path, clean):
    env = _env(_copy(clean, tmp_path))
    spec = tmp_path / "mine.yaml"
    args = ["table3", "--spec", str(spec), "--scale", "smoke"]
    path = tmp_path / "results" / "mine" / f"{RUN}.json"
    good = path.read_bytes()
    damaged = tmp_path / "results" / "mine" / "damaged"

    _truncate(path)
    # says what it will do, changes nothing (2 threads: --workers auto looks at the records too)
    out = cli({**env, "OMP_NUM_THREADS": "2"}, *args, "--dry-run")
    assert f"{RUN}: will be redone: {path}: damaged record (not valid JSON" in out.stdout
    assert path.exists() and not damaged.exists()

    out = cli(env, *args, "--render", check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert f"warning: {path}: damaged record (not valid JSON" in out.stderr
    assert "its run will be redone" in out.stderr
    assert (tmp_path / "results" / "mine.md").exists()  # the rest is rendered
    assert not path.exists() and len(list(damaged.iterdir())) == 1

    path.write_text('{"run_id": "x"}')  # JSON, but not a record
    # status reads the shipped specs' tables: a damaged record of table3 is named there
    table3 = tmp_path / "results" / "table3"
    table3.mkdir()
    (table3 / "table3-base-smoke-seed0.json").write_text("{")
    out = cli(env, "status", check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert f"{table3 / 'table3-base-smoke-seed0.json'}: damaged record" in out.stderr

    out = cli(env, *args)  # the run command redoes it and says why
    assert f"{path}: damaged record (not a run's record" in out.stdout
    assert "the run will be redone" in out.stdout
    record = _record(tmp_path)
    assert record["metrics"] == json.loads(good)["metrics"] | {
        k: record["metrics"][k] for k in ("train_seconds", "train_cpu_seconds")}
    assert len(list(damaged.iterdir())) == 2


def _local_corpus(folder: Path, n: int = 300) -> Path:
    import random

    rng = random.Random(0)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 8)))
             for _ in range(400)]
    folder.mkdir(parents=True, exist_ok=True)
    for name, count in (("train", n), ("validation", 20), ("test", 20)):
        with open(folder / f"{name}.jsonl", "w") as f:
            for _ in range(count):
                en = " ".join(rng.choices(words, k=8))
                f.write(json.dumps({"translation": {"en": en, "xx": en[::-1]}}) + "\n")
    return folder


@pytest.mark.parametrize("corpus", ["local-en-xx", "wmt14-en-de"])
def test_local_files_are_named_as_what_they_are_never_as_the_papers_corpus(tmp_path, corpus):
    data = _local_corpus(tmp_path / "mydata")
    if corpus == "wmt14-en-de":  # the same files under the paper's corpus name
        for path in data.iterdir():
            path.write_text(path.read_text().replace('"xx"', '"de"'))
    # lr_scale: smoke sets it for every run; said in the plan and kept in the record
    spec = _spec(tmp_path / "mine.yaml", {"corpus": corpus, "data_dir": str(data),
                                          "lr_scale": 100000})
    out = cli(_env(tmp_path), "table3", "--spec", str(spec), "--scale", "smoke")
    assert "scale `smoke` replaces the spec's base: lr_scale 100000.0 -> 0.1" in out.stdout
    record = _record(tmp_path)
    assert record["scale_overrode"] == {"lr_scale": {"spec": 100000.0, "scale": 0.1}}
    assert record["config"]["train"]["lr_scale"] == 0.1
    files = record["data"]["files"]
    assert files["train"]["file"] == str(data / "train.jsonl")
    import hashlib

    assert files["test"]["sha256"] == hashlib.sha256((data / "test.jsonl").read_bytes()).hexdigest()
    table = (tmp_path / "results" / "mine.md").read_text()
    corpus_line = next(line for line in table.splitlines() if line.startswith("Corpus:"))
    assert f"local files in `{data}`" in corpus_line
    assert files["train"]["sha256"][:12] in corpus_line and "dev 20 pairs" in corpus_line
    assert "as the paper" not in corpus_line and "WMT14" not in corpus_line
    assert ("not checked to be that corpus" in corpus_line) == (corpus == "wmt14-en-de")


def test_empty_data_files_and_a_local_corpus_without_files_are_one_line(tmp_path):
    data = _local_corpus(tmp_path / "mydata")
    (data / "validation.jsonl").write_text("\n")
    env = _env(tmp_path)
    spec = _spec(tmp_path / "mine.yaml", {"corpus": "local-en-xx", "data_dir": str(data)})
    out = cli(env, "table3", "--spec", str(spec), "--scale", "smoke", check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f'error: {data / "validation.jsonl"}: empty; it needs one JSON object per line, '
        '{"translation": {"en": ..., "xx": ...}}')
    (data / "train.jsonl").write_text("")
    out = cli(env, "table3", "--spec", str(spec), "--scale", "smoke", check=False)
    assert out.stderr.strip().splitlines()[-1].startswith(f"error: {data / 'train.jsonl'}: empty")
    # The table cannot be written either (its path is a folder): the data's error is still the one
    # reported, with its exit status; the render's failure is one warning line before it.
    (tmp_path / "results" / "mine.md").unlink(missing_ok=True)
    (tmp_path / "results" / "mine.md").mkdir(parents=True)
    out = cli(env, "table3", "--spec", str(spec), "--scale", "smoke", check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: {data / 'train.jsonl'}: empty")
    assert lines[-2].startswith("warning: mine: the table was not rendered either (")
    assert not (tmp_path / "results" / "mine").exists()
    # a corpus without files is found before anything runs or renders: its one line alone
    spec = _spec(tmp_path / "mine.yaml", {"corpus": "local-en-xx"})
    out = cli(env, "table3", "--spec", str(spec), "--scale", "smoke", check=False)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: corpus 'local-en-xx' reads local files: set data_dir to a folder with train.jsonl, "
        'validation.jsonl and test.jsonl whose rows are {"translation": {"en": ..., "xx": ...}}']


def test_a_variant_may_set_what_its_scale_sets_and_the_plan_says_so(tmp_path):
    """A row of one's own nuisance setting (here the learning-rate scale, which `smoke` and
    `cpu` set for every run): the variant's value wins for its runs alone, said in one line."""
    spec = _spec(tmp_path / "mine.yaml", variants={"base": {}, "hot": {"set": {"lr_scale": 2}}})
    out = cli(_env(tmp_path), "table3", "--spec", str(spec), "--scale", "smoke", "--workers", "1")
    assert "  over scale `smoke`, whose value every other run takes: hot sets lr_scale 2 (the " \
           "scale's 0.1)" in out.stdout
    lr = {v: json.loads((tmp_path / "results" / "mine" / f"mine-{v}-smoke-seed0.json")
                        .read_text())["config"]["train"]["lr_scale"] for v in ("base", "hot")}
    assert lr == {"base": 0.1, "hot": 2}


def test_kept_outputs_give_the_recorded_bleu_through_sacrebleus_command_line(tmp_path, clean):
    """Also: the hardware a speed depends on, and a W&B folder that is not this machine's path."""
    import gzip

    record = _record(clean)
    folder = clean / "results" / "mine"
    sacrebleu = Path(sys.executable).with_name("sacrebleu")
    for split in ("dev", "test"):
        bleu = record["bleu"][split]
        files = {k: folder / v for k, v in bleu["outputs"].items()}
        plain = {}
        for kind, path in files.items():
            plain[kind] = tmp_path / f"{split}.{kind}.txt"
            plain[kind].write_bytes(gzip.decompress(path.read_bytes()))
        hyps = plain["hypotheses"].read_text().splitlines()
        assert len(hyps) == bleu["sacrebleu"]["sentences"] == record["data"][f"{split}_pairs"]
        assert [e["output"] for e in bleu["examples"]] == hyps[:3]
        out = subprocess.run([str(sacrebleu), str(plain["references"]), "-i",
                              str(plain["hypotheses"]), "-w", "2"],
                             capture_output=True, text=True, check=True)
        cli_score = json.loads(out.stdout)
        # Smoke BLEU is about 0: the n-gram counts and lengths are what tell the files are right.
        assert f"BLEU = {cli_score['score']:.2f} {cli_score['verbose_score']}" == \
            bleu["sacrebleu"]["verbose"]
        assert cli_score["signature"] == bleu["sacrebleu"]["signature"]
    assert set(record["hardware"]) >= {"cpu", "cpu_flags", "gpus"}
    assert isinstance(record["hardware"]["cpu_flags"], list)
    assert not Path(record["wandb"]["dir"]).is_absolute() or \
        not Path(record["wandb"]["dir"]).is_relative_to(Path(__file__).parents[2])


def test_verify_reruns_a_record_in_scratch_and_finds_the_same_numbers(tmp_path, clean):
    env = _env(_copy(clean, tmp_path))
    path = tmp_path / "results" / "mine" / f"{RUN}.json"
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    scratch = tmp_path.parent / f"{tmp_path.name}-scratch"
    out = cli(env, "verify", str(path), "--scratch", str(scratch))
    assert "verified: the re-run gives the recorded numbers" in out.stdout
    assert "data: the same" in out.stdout and "vocabulary: the same" in out.stdout
    assert re.search(r"dev_ppl\s+([\d.]+)\s+\1\s+\+0", out.stdout)
    assert "learning curve: " in out.stdout and "all equal" in out.stdout
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing of ours touched
    assert (scratch / "results" / "mine" / f"{RUN}.json").exists()

    out = cli(env, "verify", str(path), "--steps", "12",
              "--scratch", str(tmp_path.parent / f"{tmp_path.name}-steps"))
    assert re.search(r"learning curve: (\d+) common point\(s\), all equal", out.stdout)
    assert "verified: the first 12 steps give the recorded learning curve" in out.stdout
    assert int(re.search(r"(\d+) common", out.stdout).group(1)) >= 12
    # the record's own BPE model, from the project's cache: not one trained again in scratch
    assert "tokenizer: the record's, from " in out.stdout and "vocabulary: the same" in out.stdout

    record = json.loads(path.read_text())  # a record whose curve is not what its run gives
    record["curve"]["train_loss"][1][2] += 0.5
    path.write_text(json.dumps(record))
    out = cli(env, "verify", str(path), "--steps", "3",
              "--scratch", str(tmp_path.parent / f"{tmp_path.name}-x"), check=False)
    assert out.returncode == 1
    assert "NOT the recorded numbers" in out.stdout
    assert re.search(r"1 differ \(first: train_loss at step 2: [\d.]+ recorded", out.stdout)
    # Within a tolerance (a replay on other hardware, or in bf16): the same curve passes
    loss = record["curve"]["train_loss"][1][2]
    out = cli(env, "verify", str(path), "--steps", "3", "--tolerance", "0.5",
              "--scratch", str(tmp_path.parent / f"{tmp_path.name}-y"))
    assert "all equal within 0.5" in out.stdout
    assert re.search(r"largest relative difference: ([\d.e-]+) \(train_loss at step 2\)",
                     out.stdout)
    assert "verified: the first 3 steps give the recorded learning curve within 0.5" in out.stdout
    worst = float(re.search(r"largest relative difference: ([\d.e-]+)", out.stdout).group(1))
    assert abs(worst - 0.5 / loss) < 0.01 * worst + 1e-3  # the 0.5 added, relative to the record
    # A record of another vocabulary (its BPE trained elsewhere, not in this cache): not verified
    record["data"]["vocab_sha256"] = "0" * 64
    path.write_text(json.dumps(record))
    out = cli(env, "verify", str(path), "--steps", "3", "--tolerance", "0.5",
              "--scratch", str(tmp_path.parent / f"{tmp_path.name}-z"), check=False)
    assert out.returncode == 1 and "tokenizer: the record's" not in out.stdout
    assert "vocabulary: DIFFERENT (sha256 " in out.stdout and "NOT the recorded" in out.stdout


def test_a_diverged_run_stops_is_not_recorded_and_is_not_trained_again_blindly(tmp_path):
    # an absurd learning rate (over the scale's): the loss is not finite within a few steps
    spec = _spec(tmp_path / "mine.yaml")
    env = _env(tmp_path)
    args = ("table3", "--spec", str(spec), "--scale", "smoke", "--workers", "1", "--set",
            "train.lr_scale=1e12")
    first = cli(env, *args, check=False)
    assert first.returncode == 1, first.stdout + first.stderr
    assert f"{RUN}: diverged at step " in first.stdout
    assert "last finite loss" in first.stdout
    work = tmp_path / "runs" / "mine" / RUN
    marker = json.loads((work / "diverged.json").read_text())
    assert marker["step"] < 10 and marker["config"]["train"]["lr_scale"] == 1.0e12
    assert not (tmp_path / "results" / "mine" / f"{RUN}.json").exists()
    assert not list(work.rglob("*.ckpt"))  # no checkpoint of a diverged model
    again = cli(env, *args, check=False)
    assert again.returncode == 1 and "with this config: not trained again" in again.stdout
    assert "Change a nuisance setting" in again.stdout
    # another learning rate is another config: it trains, and the old marker is kept aside
    cli(env, *args[:-1], "train.lr_scale=0.1")
    assert _record(tmp_path)["metrics"]["train_steps"] == 30
    assert not (work / "diverged.json").exists() and list(work.glob("diverged-*.json"))


def test_sigterm_saves_the_step_it_stopped_at_and_the_run_resumes_from_it_exactly(tmp_path):
    """A preemption or time limit (SIGTERM) loses no more than the step in flight: a checkpoint is
    saved at the step it stopped at, the next start resumes there, and averaging never counts it,
    so the record equals an uninterrupted run's. Stopped twice: mid-epoch at a step with a dev
    evaluation (resumed, Lightning counted a step more on the loggers' axis), then at the first
    epoch's last step (where Lightning has counted the epoch done before it stops: resumed as
    saved, it counted it again and trained the third epoch's batches in place of the second's)."""
    # 300 training pairs: epochs of about 20 steps, so the 30 steps run into a second
    args = ["table3", "--spec", str(_spec(tmp_path / "mine.yaml")), "--scale", "smoke", "--set",
            "data.max_train_pairs=300"]
    clean = tmp_path / "clean"
    cli(_env(clean), *args)
    work = tmp_path / "runs" / "mine" / RUN
    env = inject(_env(tmp_path), tmp_path / "inject", FAULTS)
    stops, epochs_done = [], []
    for fault in ("sigterm-at-10", "sigterm-at-epoch-end"):
        out = cli({**env, "REPRODUCE_TEST_FAULT": fault}, *args, check=False)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        line = out.stderr.strip().splitlines()[-1]
        match = re.search(r"stopped by SIGTERM at step (\d+) of 30; saved at that step \((.+)\)",
                          line)
        assert match, line
        step, saved = int(match[1]), Path(match[2])
        assert saved == work / "checkpoints" / "preempted.ckpt"
        checkpoint = torch.load(saved, map_location="cpu", weights_only=False)
        assert checkpoint["global_step"] == step
        # the loggers' step (W&B's axis), which a resume put one ahead before
        assert checkpoint["loops"]["fit_loop"]["epoch_loop.state_dict"][
            "_batches_that_stepped"] == step
        assert not (tmp_path / "results" / "mine" / f"{RUN}.json").exists()
        stops.append(step)
        epochs_done.append(checkpoint["loops"]["fit_loop"]["epoch_progress"]["total"]["completed"])
    assert stops[0] == 10 < stops[1] < 30
    assert epochs_done == [0, 1]  # the second stop came as the first epoch ended
    # resumed where it stopped, not a checkpoint before; a third SIGTERM after the last step's
    # end (as training ends): its final weights saved, it stops before evaluating
    out = cli({**env, "REPRODUCE_TEST_FAULT": "sigterm-at-train-end"}, *args, check=False)
    assert f"resuming from {work / 'checkpoints' / 'preempted.ckpt'}" in out.stdout, out.stdout
    assert out.returncode == 1 and out.stderr.strip().splitlines()[-1] == (
        f"{RUN}: stopped by SIGTERM after its last step (30), its final weights saved; run the "
        "command again to evaluate and record it"), out.stderr
    assert not (tmp_path / "results" / "mine" / f"{RUN}.json").exists()
    out = cli(_env(tmp_path), *args)
    # no library's warning on resuming (its own checkpoints; SLURM's srun, where it is installed)
    assert not re.findall(r".*\.py:\d+: .*", out.stderr), out.stderr
    resumed = _record(tmp_path)
    assert resumed["resumed_from"]["step"] == 30  # only evaluated
    assert _comparable(resumed) == _comparable(_record(clean))


def test_ctrl_c_saves_the_step_it_stopped_at_and_twice_stops_at_once(tmp_path):
    """Ctrl-C before training: one line. While a run trains: the step in flight ends and is saved,
    and one line says where (Lightning alone exited 1 without a word, losing the steps since the
    last checkpoint). The same command resumes there. Ctrl-C twice stops at once, in one line."""
    spec = _spec(tmp_path / "mine.yaml", base={"train_steps": 1000000})  # 300 steps at smoke
    args = ["table3", "--spec", str(spec), "--scale", "smoke"]
    folder = tmp_path / "runs" / "mine" / RUN / "checkpoints"
    saved = folder / "preempted.ckpt"

    def ctrl_c(env: dict[str, str], times: int, after_step: int) -> tuple[int, str, str]:
        proc = start(env, *args, sigint=True)  # as from a terminal
        deadline = time.time() + 300
        while not any(int(p.stem.removeprefix("step")) > after_step
                      for p in folder.glob("step*.ckpt")):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.1)
        for _ in range(times):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.3)
        out, err = proc.communicate(timeout=120)
        assert "Traceback" not in err, err
        return proc.returncode, out, err

    def after(fault: str, wait_for) -> str:  # Ctrl-C outside training: one line, exit 130
        proc = start({**inject(_env(tmp_path), tmp_path / "inject", FAULTS),
                      "REPRODUCE_TEST_FAULT": fault}, *args, sigint=True)
        deadline = time.time() + 300
        while not wait_for():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and err.strip().splitlines()[-1] == \
            "interrupted (Ctrl-C); run the same command again to go on", err
        return out

    after("slow-data", (tmp_path / "runs" / "preparing-data").exists)  # for a minute
    code, out, err = ctrl_c(_env(tmp_path), 1, 0)
    line = err.strip().splitlines()[-1]
    assert code == 1 and "Ctrl-C: stopping at the end of this step, saved there" in err, err
    stop = re.fullmatch(r"mine-base-smoke-seed0: stopped by SIGINT at step (\d+) of 300; saved at "
                        r"that step \((.+)\); run the command again to resume from it", line)
    assert stop and Path(stop[2]) == saved, line
    step = int(stop[1])
    assert torch.load(saved, map_location="cpu", weights_only=False)["global_step"] == step
    # resumed there; Ctrl-C twice inside a (slowed) step
    slow = {**inject(_env(tmp_path), tmp_path / "inject", FAULTS), "REPRODUCE_TEST_FAULT":
            "slow-steps"}
    code, out, err = ctrl_c(slow, 2, step)
    assert f"resuming from {saved}" in out, out
    assert code == 1 and re.fullmatch(r"mine-base-smoke-seed0: interrupted at step \d+ of 300; run "
                                      r"the command again to resume it from its last checkpoint",
                                      err.strip().splitlines()[-1]), err
    # a run of 30 steps, trained, then Ctrl-C in its final dev evaluation (slowed)
    args[2] = str(_spec(tmp_path / "short" / "mine.yaml"))
    folder = tmp_path / "runs" / "mine" / RUN / "checkpoints"
    shutil.rmtree(folder.parent)
    out = after("slow-evaluation", (tmp_path / "runs" / "evaluating").exists)
    assert "dev PPL" in out and not list((tmp_path / "results").glob("mine/*.json"))


# Faults injected into the real CLI (``helpers.inject``), chosen by REPRODUCE_TEST_FAULT (several
# with commas): SIGTERM or SIGKILL during a step; a GPU running out of memory at step 7; a full disk when
# the step-10 checkpoint is written; a read-only results folder (every durable write and the
# writable check make their temporary file first); a disk with 2 MB free.
FAULTS = '''
import errno, os, shutil, tempfile

faults = os.environ.get("REPRODUCE_TEST_FAULT", "").split(",")
fault = faults[0]
if "small-disk" in faults:
    _usage = shutil.disk_usage

    def disk_usage(path):
        return _usage(path)._replace(free=2_000_000)

    shutil.disk_usage = disk_usage
if fault == "sigterm-at-train-end":  # as training ends, after the last step's end
    import signal
    import reproduce.train.lit as lit

    def on_train_end(self):
        os.kill(os.getpid(), signal.SIGTERM)

    lit.TranslationModule.on_train_end = on_train_end
elif fault.startswith("kill-9-at-"):  # the process killed outright during the step named
    import signal
    import reproduce.train.lit as lit

    _step = lit.TranslationModule.training_step

    def killed_step(self, batch, batch_idx):
        if self.trainer.global_step + 1 == int(fault.removeprefix("kill-9-at-")):
            os.kill(os.getpid(), signal.SIGKILL)
        return _step(self, batch, batch_idx)

    lit.TranslationModule.training_step = killed_step
elif fault.startswith("sigterm-at-"):  # as a scheduler's, during the step named (or an epoch's last)
    import signal
    import reproduce.train.lit as lit

    _train = lit.TranslationModule.training_step

    def stopped_step(self, batch, batch_idx):
        at = fault.removeprefix("sigterm-at-")
        last = self.trainer.is_last_batch and self.trainer.current_epoch == 0
        if (last if at == "epoch-end" else self.trainer.global_step + 1 == int(at)):
            os.kill(os.getpid(), signal.SIGTERM)
        return _train(self, batch, batch_idx)

    lit.TranslationModule.training_step = stopped_step
if "slow-data" in faults:  # a data preparation of a minute, before training
    import time
    import reproduce.train.runner as runner

    _build = runner.build_data

    def slow_build(config):
        open(os.path.join(os.environ["REPRODUCE_RUNS"], "preparing-data"), "w").close()
        time.sleep(60)
        return _build(config)

    runner.build_data = slow_build
if "slow-evaluation" in faults:  # the final dev evaluation, a second a batch
    import time
    import reproduce.train.lit as lit

    _validate = lit.TranslationModule.validation_step

    def slow_validation(self, batch, batch_idx):
        if self.trainer.state.fn == "validate":
            open(os.path.join(os.environ["REPRODUCE_RUNS"], "evaluating"), "w").close()
            time.sleep(1.0)
        return _validate(self, batch, batch_idx)

    lit.TranslationModule.validation_step = slow_validation
if "slow-steps" in faults:  # a second a step: a signal lands inside one
    import time
    import reproduce.train.lit as lit

    _slow = lit.TranslationModule.training_step

    def slow_step(self, batch, batch_idx):
        time.sleep(1.0)
        return _slow(self, batch, batch_idx)

    lit.TranslationModule.training_step = slow_step
if "oom" in faults:
    import torch
    import reproduce.train.lit as lit

    _step = lit.TranslationModule.training_step

    def training_step(self, batch, batch_idx):
        if self.trainer.global_step == 7:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return _step(self, batch, batch_idx)

    lit.TranslationModule.training_step = training_step
elif fault in ("enospc", "erofs"):
    _mkstemp = tempfile.mkstemp

    def mkstemp(suffix=None, prefix=None, dir=None, text=False):
        target = os.path.join(str(dir), (prefix or "") + "X")
        full = fault == "enospc" and (prefix or "").startswith(".step10.ckpt")
        read_only = fault == "erofs" and str(dir).startswith(os.environ["REPRODUCE_RESULTS"])
        if full or read_only:
            code = errno.ENOSPC if full else errno.EROFS
            raise OSError(code, os.strerror(code), target)
        return _mkstemp(suffix, prefix, dir, text)

    tempfile.mkstemp = mkstemp
'''


def test_out_of_memory_a_full_disk_and_wandb_down_and_the_run_resumes_exactly(tmp_path, clean):
    """A GPU out of memory (injected on the CPU at step 7): one line naming the run and the
    micro-batch to lower. Then, resumed, a full disk as the step-10 checkpoint is written: one line
    naming the folder. Each time exit 1, the claim released, nothing recorded and no checkpoint
    half-written. The same command then resumes, with W&B online and unreachable, to the
    uninterrupted run's record."""
    args = ["table3", "--spec", str(_spec(tmp_path / "mine.yaml")), "--scale", "smoke"]
    work = tmp_path / "runs" / "mine" / RUN
    env = inject(_env(tmp_path), tmp_path / "inject", FAULTS)

    # 2 MB free, less than the checkpoints' need, and --skip-disk-check: started all the same
    out = cli({**env, "REPRODUCE_TEST_FAULT": "oom,small-disk"}, *args, "--skip-disk-check",
              check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {RUN}: out of memory on the CPU while training with "
                           "micro-batches of ") and "(CUDA out of memory. Tried to allocate" in line
    assert "Lower train.device_batch_tokens" in line and "resume from the last checkpoint" in line
    assert claims.holder(work) is None and _newest_step(work) == 5

    out = cli({**env, "REPRODUCE_TEST_FAULT": "enospc"}, *args, check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    line = out.stderr.strip().splitlines()[-1]
    assert line == (f"error: {RUN}: cannot write to {work / 'checkpoints'}: No space left on "
                    "device (ENOSPC). Nothing was left half-written; make room (or make it "
                    "writable) and run the command again: it resumes from the last checkpoint")
    assert claims.holder(work) is None and _newest_step(work) == 5
    assert not list((work / "checkpoints").glob(".*tmp"))
    assert not (tmp_path / "results" / "mine" / f"{RUN}.json").exists()

    # Resumed online, with W&B's server unreachable: at most WANDB_INIT_TIMEOUT seconds of
    # waiting, one warning line, everything logged offline; the API key is nowhere.
    key = "0123456789abcdef0123456789abcdef01234567"
    out = cli({**_env(tmp_path), "WANDB_MODE": "", "WANDB_API_KEY": key,
               "WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_INIT_TIMEOUT": "5"}, *args)
    assert out.stdout.count("W&B is unreachable") == 1, out.stdout
    resumed = _record(tmp_path)
    assert resumed["resumed_from"]["step"] == 5
    assert _comparable(resumed) == _comparable(_record(clean))
    assert resumed["wandb"]["mode"] == "offline" and (tmp_path / resumed["wandb"]["dir"]).is_dir()
    written = [out.stdout, out.stderr] + [p.read_bytes().decode("latin-1")
                                          for p in (tmp_path / "results").rglob("*") if p.is_file()]
    written += [p.read_bytes().decode("latin-1") for p in (work / "wandb").rglob("*") if p.is_file()]
    assert not [text for text in written if key in text]


def test_a_read_only_results_folder_is_found_before_training(tmp_path):
    env = inject(_env(tmp_path), tmp_path / "inject", FAULTS)
    out = cli({**env, "REPRODUCE_TEST_FAULT": "erofs"}, "table3", "--spec",
              str(_spec(tmp_path / "mine.yaml")), "--scale", "smoke", check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f"error: the results folder {tmp_path / 'results'} is not writable: Read-only file system "
        "(nothing was trained; --results DIR writes them elsewhere)")
    assert not (tmp_path / "runs" / "mine").exists()


def test_a_run_whose_checkpoints_would_not_fit_is_not_started(tmp_path):
    env = inject(_env(tmp_path), tmp_path / "inject", FAULTS)
    spec = _spec(tmp_path / "mine.yaml")
    out = cli({**env, "REPRODUCE_TEST_FAULT": "small-disk"}, "table3", "--spec", str(spec),
              "--scale", "smoke", check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    line = out.stderr.strip().splitlines()[-1]
    work = tmp_path / "runs" / "mine" / RUN
    assert re.fullmatch(
        rf"error: {RUN}: its checkpoints need up to [\d.]+ MB on disk \(3 step file\(s\) of "
        rf"[\d.]+ MB, weights only; last.ckpt of [\d.]+ MB\), and {re.escape(str(work / 'checkpoints'))} "
        r"has 2 MB free: not started \(nothing was trained\)\. Make room, put the runs elsewhere "
        r"\(REPRODUCE_RUNS=DIR\), or start it anyway with --skip-disk-check", line), line
    assert claims.holder(work) is None and not (work / "checkpoints").exists()
    # the dry run states it beside the free space
    out = cli({**env, "REPRODUCE_TEST_FAULT": "small-disk"}, "table3", "--spec", str(spec),
              "--scale", "smoke", "--dry-run")
    assert re.search(rf"disk: {RUN}'s checkpoints need up to [\d.]+ MB .* has 2 MB free", out.stdout)


@pytest.mark.slow
def test_a_record_on_files_since_edited_is_redone_and_no_table_compares_across_the_edit(tmp_path):
    data = _local_corpus(tmp_path / "mydata")
    spec = tmp_path / "mine.yaml"
    spec.write_text("table: mine\nkind: table3\nsplit: dev\n"
                    f"base: {json.dumps({'corpus': 'local-en-xx', 'data_dir': str(data)})}\n"
                    "variants: {base: {}, P1: {set: {p_attn: 0.1}}}\nrows: {P: [P1]}\n")
    env = _env(tmp_path)
    cli(env, "table3", "--spec", str(spec), "--scale", "smoke")
    lines = (data / "train.jsonl").read_text().splitlines()
    (data / "train.jsonl").write_text("\n".join(lines[:250]) + "\n")  # edited in place
    plan = cli(env, "table3", "--spec", str(spec), "--scale", "smoke", "--dry-run").stdout
    assert (f"mine-base-smoke-seed0: will be redone: {tmp_path / 'results' / 'mine'}/"
            "mine-base-smoke-seed0.json: its train data") in plan
    # P1 alone: redone on the new text; base's record stays, made on the old
    out = cli(env, "table3", "--spec", str(spec), "--scale", "smoke", "--variant", "P1")
    said = out.stdout + out.stderr
    assert (f"mine-P1-smoke-seed0: its train data ({data / 'train.jsonl'}) changed since it was "
            "trained (sha256 ") in said
    assert list((tmp_path / "results" / "mine" / "superseded").glob("mine-P1-smoke-seed0.*.json"))
    assert _record(tmp_path, "mine-P1-smoke-seed0")["data"]["train_pairs"] <= 250
    row = next(line for line in (tmp_path / "results" / "mine.md").read_text().splitlines()
               if line.startswith("| (P) P1"))
    assert "not compared: trained on other data than base" in row, row
    # the sweep, run again, redoes base on the new text: the table compares them again
    out = cli(env, "table3", "--spec", str(spec), "--scale", "smoke")
    said = out.stdout + out.stderr
    assert "mine-base-smoke-seed0: its train data" in said
    assert "mine-P1-smoke-seed0: finished earlier" in said  # its record is of the files as they are
    table = (tmp_path / "results" / "mine.md").read_text()
    assert "not compared" not in table


def test_checkpoints_of_files_since_edited_are_not_resumed(tmp_path, monkeypatch):
    # stopped before the edit: no record, only checkpoints; the run's data.json tells them apart
    from reproduce.records.store import DATA_FILE, retire_stale
    from reproduce.records.sweep import load_spec

    monkeypatch.setenv("REPRODUCE_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("REPRODUCE_RESULTS", str(tmp_path / "results"))
    data = _local_corpus(tmp_path / "mydata")
    spec = load_spec(str(_spec(tmp_path / "mine.yaml", {"corpus": "local-en-xx",
                                                          "data_dir": str(data)})))
    (run,) = spec.plan(["base"], "smoke", [0])
    work = tmp_path / "runs" / "mine" / run.run_id
    retire_stale(run, work)  # before its first step: the files' SHA-256 noted
    noted = json.loads((work / DATA_FILE).read_text())
    (work / "checkpoints").mkdir()
    torch.save({"global_step": 10, "hyper_parameters": {"config": run.config.to_dict()}},
               work / "checkpoints" / "step10.ckpt")
    retire_stale(run, work)  # the same files: the checkpoints stay
    assert (work / "checkpoints" / "step10.ckpt").exists()
    (data / "train.jsonl").write_text((data / "train.jsonl").read_text().replace("a", "b"))
    retire_stale(run, work)
    assert not (work / "checkpoints").exists()
    assert [p.name for p in work.glob("superseded-*/checkpoints/*")] == ["step10.ckpt"]
    assert json.loads((work / DATA_FILE).read_text())["train"] != noted["train"]
