"""A GPU window in one prepared command: what matters most first, each part capped, its output
copied to ``--out`` as soon as the part ends, all of it inside ``--seconds`` of wall clock.

    python3 benchmarks/gpu_window.py --out $OUT [--seconds 360] [--run-seconds 170]
        [--pairs 200000] [--steps 120] [--eval-pairs 200] [--scale paper] [--cap PART=SECONDS ...]

Made for the lent GPU machines (no network, Python with torch and Lightning but not our other
dependencies), whose device time comes in windows of 15 minutes counted from the machine's start:

1. **preflight** (about 10 s): Python, torch, CUDA, the GPU's name and free memory, nvidia-smi,
   with the kit (``tools/offline-gpu/install.sh``) installing meanwhile (10-25 s on the H200s);
2. **base on the fast path through the real CLI** (``benchmarks/paper_run.py --compile on``:
   Table 2's base EN-DE at the paper's size and batch on a generated corpus of ``--pairs`` pairs,
   ``--steps`` steps, ``--eval-pairs`` dev and test sentences; compiled once, into the cache the
   run then uses), at most ``--run-seconds``. Its record holds the profile of a steady step
   (``step_census``: the host's span, the GPU's busy time, the costliest kernels). Stopped at its
   cap, the seconds a step its log showed are kept in the summary;
3. **``bench --gpu``** with what is left: base and big on the fast path, base's two passes
   against its one, the ``nn.Transformer`` peer eager and compiled, eager base and big for
   reference, then beam search, TF32 and the memory search, each under its own cap
   (``reproduce/speed/gpu.py``'s ``PARTS``; a short budget cuts the last).

Into ``--out`` (at most 8 files, as the device tool brings back): ``summary.json`` (the preflight,
each stage's seconds and outcome; rewritten after each), ``window.log`` (every stage's output),
``paper-run.md``, ``paper-run.json`` (the run's record) and ``tokenizer.tar.gz`` (its BPE model,
which a CPU ``verify`` of the run needs: unpack it into the cache), ``gpu.md`` and ``gpu.json``
(written by ``bench --gpu`` after each of its parts) and, where fewer than 8 files came back,
``inductor-cache.tar.gz`` (the kernels the run compiled, under 60 MB: unpacked into
``<work>/cache`` of the next window, carried with it, its run loads them instead of compiling).
Exits 1 only when nothing was measured.

On a CPU the same command rehearses it (``--scale smoke --compile-backend eager``: a tiny model,
dynamo's capture without inductor's codegen; ``tests/speed/test_gpu_window.py``). The checklist:
docs/developing.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPILE_BACKEND_ENV = "REPRODUCE_COMPILE_BACKEND"  # reproduce.train.step_time's (not imported:
# the window starts before the kit installs what the project imports)
STEP_LINE = re.compile(r"^step (\d+)/\d+\s+loss \S+\s+(\d+) s$", re.M)  # train/callbacks.py's line
PREFLIGHT = """
import json, platform, shutil, subprocess, torch
info = {"python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "gpu_available": torch.cuda.is_available(),
        "cpus": __import__("os").cpu_count()}
if torch.cuda.is_available():
    free, total = torch.cuda.mem_get_info()
    info.update(gpu=torch.cuda.get_device_name(0), gpus=torch.cuda.device_count(),
                capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                bf16=torch.cuda.is_bf16_supported(), free_gib=free / 2**30, total_gib=total / 2**30)
if shutil.which("nvidia-smi"):
    info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,"
        "memory.used,memory.total,clocks.sm,clocks.max.sm", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=10).stdout.strip()
print(json.dumps(info))
"""


class Window:
    """The window's clock, its log and its summary, written after every stage."""

    def __init__(self, out: Path, seconds: float) -> None:
        self.out, self.seconds, self.start = out, seconds, time.monotonic()
        out.mkdir(parents=True, exist_ok=True)
        self.log = open(out / "window.log", "a", buffering=1)
        self.summary: dict = {"seconds": seconds, "stages": {}}

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def say(self, line: str) -> None:
        stamped = f"[{time.monotonic() - self.start:6.1f} s] {line}"
        print(stamped, flush=True)
        self.log.write(stamped + "\n")

    def stage(self, name: str, **result) -> None:
        self.summary["stages"][name] = {"ended_at_s": round(time.monotonic() - self.start, 1),
                                        **result}
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1) + "\n")
        self.say(f"{name}: {result}")

    def run(self, name: str, argv: list[str], seconds: float, env: dict | None = None) -> int | None:
        """``argv`` with its output in the log, interrupted (SIGINT, as Ctrl-C) after ``seconds``
        and killed 15 s later; its exit status, or None when it was stopped."""
        self.say(f"{name}: {' '.join(argv)} (at most {seconds:.0f} s)")
        started = time.monotonic()
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=max(1.0, seconds))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc = None
        self.stage(name, seconds=round(time.monotonic() - started, 1),
                   outcome="stopped at its time" if rc is None else f"exit {rc}")
        return rc


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    w = Window(args.out, args.seconds)
    # the project from this tree, where it is not installed (the lent machines): scripts in
    # benchmarks/ import it too
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline",
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if args.compile_backend:
        env[COMPILE_BACKEND_ENV] = args.compile_backend
    kit = not args.no_kit and (ROOT / ".kit" / "requirements.txt").is_file()
    if kit:  # the copy may lack .git, or hold one that lags (docs/developing.md)
        env["REPRODUCE_COMMIT"] = (ROOT / ".kit" / "commit").read_text().strip()
    install = start_install(w, env) if kit else None
    preflight(w)
    if not kit:
        w.say("install: no kit used; the packages this Python has are used")
    measured = False
    if args.run_seconds <= 0:
        w.say("paper-scale run: not run (--run-seconds 0)")
    elif finish_install(w, install, env):
        measured = paper_run(w, args, env)
    bench = [sys.executable, "-m", "reproduce", "bench", "--gpu", "--out", str(args.out / "gpu.md"),
             "--budget", f"{max(1.0, w.left() - 15):.0f}"]
    if args.no_bench:
        w.say("bench --gpu: not run (--no-bench)")
    elif w.left() > 20:
        w.run("bench --gpu", bench + (["--cap", *args.cap] if args.cap else []), w.left() - 5, env)
    measured |= bench_measured(args.out / "gpu.json")
    w.say(f"done: {'something' if measured else 'nothing'} measured; "
          f"{', '.join(sorted(p.name for p in args.out.iterdir()))} in {args.out}")
    return 0 if measured else 1


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=360.0,
                        help="the window's wall clock, everything included (default 360)")
    parser.add_argument("--run-seconds", type=float, default=170.0,
                        help="the paper-scale run's cap (default 170; 0: not run)")
    parser.add_argument("--pairs", type=int, default=200_000)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--eval-pairs", type=int, default=200)
    parser.add_argument("--scale", default="paper")
    parser.add_argument("--cap", nargs="+", default=[], metavar="PART=SECONDS",
                        help="bench --gpu's caps (reproduce/speed/gpu.py's PARTS; 0 skips one)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu-window"))
    parser.add_argument("--compile", choices=("off", "on", "auto"), default="on",
                        help="the paper-scale run's train.compile (default on: the fast path)")
    parser.add_argument("--compile-backend", default="",
                        help=f"torch.compile's backend ({COMPILE_BACKEND_ENV}; default inductor): "
                        "eager rehearses the compiled paths on a CPU in seconds")
    parser.add_argument("--profile", action="store_true",
                        help="the paper-scale run under cProfile (paper_run.py --profile)")
    parser.add_argument("--batch-shapes", type=int, default=0,
                        help="the paper-scale run's train.batch_shapes (paper_run.py)")
    parser.add_argument("--micro-batch", default="",
                        help="the paper-scale run's train.device_batch_tokens (default: the "
                        "scale's; paper's is auto)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="more config values for the paper-scale run (paper_run.py --set)")
    parser.add_argument("--no-bench", action="store_true", help="the paper-scale run alone")
    parser.add_argument("--no-kit", action="store_true", help="leave .kit/ alone: this Python's "
                        "packages as they are (a rehearsal in the project's environment)")
    return parser.parse_args(argv)


def bench_measured(path: Path) -> bool:
    try:
        return bool(json.loads(path.read_text())["parts"])
    except (OSError, ValueError, KeyError):
        return False


def preflight(w: Window) -> None:
    started = time.monotonic()
    try:
        out = subprocess.run([sys.executable, "-c", PREFLIGHT], capture_output=True, text=True,
                             timeout=60)
        info = json.loads(out.stdout) if out.returncode == 0 else {
            "error": " ".join(out.stderr.strip().splitlines()[-1:])}
    except (subprocess.TimeoutExpired, json.JSONDecodeError) as e:
        info = {"error": str(e)}
    w.stage("preflight", seconds=round(time.monotonic() - started, 1), **info)


def start_install(w: Window, env: dict) -> subprocess.Popen:
    """The kit's install, in the background."""
    w.say("install: tools/offline-gpu/install.sh in the background")
    return subprocess.Popen(["bash", "tools/offline-gpu/install.sh"], cwd=ROOT,
                            env={**env, "PYTHON": sys.executable},
                            stdout=w.log, stderr=subprocess.STDOUT)


def finish_install(w: Window, install: subprocess.Popen | None, env: dict) -> bool:
    """Wait for the install (while the window lasts); set the kit's environment; True when the
    CLI can run."""
    kit = ROOT / ".kit"
    if install is not None:
        try:
            rc = install.wait(timeout=max(1.0, w.left() - 30))
        except subprocess.TimeoutExpired:
            install.kill()
            rc = None
        w.stage("install", outcome="not done in time" if rc is None else f"exit {rc}")
        if rc != 0:
            return False
        env["REPRODUCE_BIBLE_DB"] = str(kit / "bible.db")
    return True


def paper_run(w: Window, args: argparse.Namespace, env: dict) -> bool:
    """The paper-scale run through the CLI within ``--run-seconds``; its report, record and
    tokenizer copied out, and where it was stopped before its record, the step times its log
    showed. True when it recorded a run."""
    work = args.work / f"{args.scale}-{args.pairs}"
    logged = w.log.tell()
    rc = w.run("paper-scale run", [
        sys.executable, "benchmarks/paper_run.py", "--pairs", str(args.pairs), "--steps",
        str(args.steps), "--eval-pairs", str(args.eval_pairs), "--scale", args.scale, "--work",
        str(work), "--out", str(args.out / "paper-run.md"), "--compile", args.compile,
        "--batch-shapes", str(args.batch_shapes),
        *(["--micro-batch", args.micro_batch] if args.micro_batch else []),
        *(["--set", *args.set] if args.set else []), *(["--profile"] if args.profile else [])],
        min(args.run_seconds, w.left() - 10), env)
    recorded = (args.out / "paper-run.json").exists()  # paper_run.py wrote it
    if rc is None and not recorded:
        with open(w.out / "window.log") as log:
            log.seek(logged)
            w.stage("paper-scale run, as logged", **logged_steps(log.read()))
    models = sorted((work / "cache" / "spm").glob("*.model"))
    if models:
        with tarfile.open(args.out / "tokenizer.tar.gz", "w:gz") as tar:
            for model in models:
                tar.add(model, arcname=f"spm/{model.name}")
    kernels = work / "cache" / "inductor"  # the run's compile cache (step_time.use_compile_cache)
    size = sum(f.stat().st_size for f in kernels.rglob("*") if f.is_file()) if kernels.is_dir() else 0
    kept = None  # a carry takes 64 MiB
    room = 8 - (0 if args.no_bench else 2)  # the device tool brings back 8; bench writes 2
    if args.compile != "off" and 0 < size < 60e6 and len(list(args.out.iterdir())) < room:
        with tarfile.open(args.out / "inductor-cache.tar.gz", "w:gz", compresslevel=1) as tar:
            tar.add(kernels, arcname="inductor")
        kept = round((args.out / "inductor-cache.tar.gz").stat().st_size / 1e6, 1)
    w.stage("copied", record=recorded, tokenizers=[m.name for m in models],
            compile_cache_mb=kept)
    return recorded


def logged_steps(text: str) -> dict:
    """What a stopped run's progress lines (``STEP_LINE``) show: the last step reached, its
    seconds, and the seconds a step from the first line past step 0 (the compile and the first
    batches are before it) to the last: whole seconds at both ends, so over many steps."""
    points = [(int(a), int(b)) for a, b in STEP_LINE.findall(text) if int(a) > 0]
    slope = ((points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])
             if len(points) > 1 and points[-1][0] > points[0][0] else None)
    return {"last_step": points[-1][0] if points else None,
            "at_seconds": points[-1][1] if points else None,
            "step_s": None if slope is None else round(slope, 4),
            "steps_timed": points[-1][0] - points[0][0] if slope is not None else 0}


if __name__ == "__main__":
    sys.exit(main())
