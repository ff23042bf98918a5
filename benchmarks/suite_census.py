"""Where the test suite's CPU goes: README's test command, optionally capped to fewer cores, with
the CPU of each test counted per pytest-xdist worker and the SLURM tasks' apart.

    python benchmarks/suite_census.py [--cores 1.6] [--out suite-census.md] [-- PYTEST ARGS]

Needs root and cgroup v1 (``/sys/fs/cgroup/cpu`` and ``cpuacct``), as on the project's machines.
Each worker moves itself into a cpuacct group of its own as it starts (this module is also the
pytest plugin, ``-p benchmarks.suite_census``), so a test's CPU is its worker's, with every process
the worker started: CLIs forked from the zygotes, DDP ranks, compilers. The two-node SLURM's
``slurmd`` (``tools/slurm/cluster.sh up``) goes into another group, whose CPU a SLURM test is
given over its span (the SLURM tests run one at a time, on one worker). ``--cores`` caps pytest
and ``slurmd`` together with a CFS quota. 1.6 cores of the AVX-512 EPYC match the GFLOP/s of the
slower 2-core EPYC without AVX-512, but not its Python: there the suite took 1,391 s against
948-1,013 under that cap (2026-12-02); ~1.15 would stand in (scaled by the two, not checked).
The suite is CPU-bound where the used core seconds reach cores x wall; then each core second cut
is 1/cores of a second of wall.

Every Python process of the suite is counted too, by kind (a CLI forked from ``tests/zygote.py``,
a fresh ``python -m reproduce``, a rank Lightning started, a SLURM task, pytest's own): a
``sitecustomize`` on ``PYTHONPATH`` logs each one as it starts and its CPU as it exits (a process
ended by a signal logs no exit; one a fault's own ``sitecustomize`` shadows, nothing).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU, ACCT = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpuacct")
GROUP = "reproduce-suite"
LOG_ENV = "REPRODUCE_SUITE_CENSUS"
PROCESS_LOG_ENV = "REPRODUCE_SUITE_PROCESSES"
# what each Python of the suite runs as it starts: log the start, and the CPU at a normal exit
# (a forked child's CPU counts from its fork, so a zygote's CLIs have no imports in theirs)
SITECUSTOMIZE = '''
import os
if os.environ.get("REPRODUCE_SUITE_PROCESSES"):
    import atexit, json, resource, sys
    def _log(**what):
        try:  # never the reason a process of the suite fails
            with open(os.environ["REPRODUCE_SUITE_PROCESSES"], "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "argv": sys.orig_argv[1:4] + sys.argv[1:2],
                                    "slurm": "SLURM_JOB_ID" in os.environ, **what}) + "\\n")
        except Exception:
            pass
    def _exit():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        _log(cpu=usage.ru_utime + usage.ru_stime, torch="torch" in sys.modules)
    _log(start=True)
    atexit.register(_exit)
    os.register_at_fork(after_in_child=lambda: _log(start=True))
'''
assert PROCESS_LOG_ENV in SITECUSTOMIZE


def _usage(name: str) -> float | None:
    try:
        return int((ACCT / name / "cpuacct.usage").read_text()) / 1e9
    except OSError:
        return None


def _join(group: Path, pid: int) -> None:
    group.mkdir(exist_ok=True)
    (group / "cgroup.procs").write_text(str(pid))


# --- the plugin, in each xdist worker ---------------------------------------------------------

def pytest_configure(config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and os.environ.get(LOG_ENV):
        _join(ACCT / f"{GROUP}-{worker}", os.getpid())


def pytest_runtest_logreport(report) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker or not os.environ.get(LOG_ENV):
        return
    with open(os.environ[LOG_ENV], "a") as f:
        f.write(json.dumps({"worker": worker, "id": report.nodeid, "when": report.when,
                            "seconds": report.duration, "end": time.time(),
                            "cpu": _usage(f"{GROUP}-{worker}"),
                            "slurm": _usage(f"{GROUP}-slurm")}) + "\n")


# --- the census ---------------------------------------------------------------------------------

def census(rows: list[dict]) -> dict:
    """Per test and per file: wall seconds and CPU seconds (the worker's between its reports; a
    SLURM test's also the tasks' over its span)."""
    rows = sorted(rows, key=lambda r: r["end"])
    last: dict[str, float] = {}
    tests: dict[str, dict] = collections.defaultdict(lambda: {"wall": 0.0, "cpu": 0.0})
    for r in rows:
        cpu = r["cpu"] - last.get(r["worker"], r["cpu"])
        last[r["worker"]] = r["cpu"]
        tests[r["id"]]["wall"] += r["seconds"]
        tests[r["id"]]["cpu"] += cpu
    slurm = [r for r in rows if r["slurm"] is not None]
    for test in {r["id"] for r in rows if "slurm" in r["id"].split("::")[0]}:
        mine = [r for r in slurm if r["id"] == test]
        if not mine:
            continue
        begin = mine[0]["end"] - mine[0]["seconds"]
        before = [r["slurm"] for r in slurm if r["end"] <= begin] or [slurm[0]["slurm"]]
        tests[test]["slurm"] = mine[-1]["slurm"] - before[-1]
    files: dict[str, dict] = collections.defaultdict(lambda: {"wall": 0.0, "cpu": 0.0,
                                                               "slurm": 0.0})
    for test, t in tests.items():
        for key in files[test.split("::")[0]]:
            files[test.split("::")[0]][key] += t.get(key, 0.0)
    return {"tests": dict(tests), "files": dict(files)}


def kind(argv: list[str], slurm: bool) -> str:
    """What a Python process of the suite was, from its command line (``sys.orig_argv[1:4]``
    and, last, ``sys.argv[1]``: for a zygote's child, the CLI command it became)."""
    if argv and argv[0].endswith("zygote.py"):
        what = f"CLI forked from a zygote: {argv[-1]}" if len(argv) > 1 else "a zygote"
    elif argv[:2] == ["-m", "reproduce"]:
        what = "fresh: rank 0 of a DDP run" if argv[2:3] == ["_rank-run"] else (
            f"fresh: python -m reproduce {argv[2] if len(argv) > 2 else ''}")
    elif argv[:2] == ["-m", "reproduce.__main__"]:
        what = "fresh: a DDP rank Lightning started"
    elif argv[:2] == ["-m", "reproduce.launch.task_process"]:
        what = "fresh: a task's process"
    elif argv[:2] in (["-m", "pytest"], ["-u", "-c"]):
        what = "pytest and its workers (tests run in-process)"
    else:
        what = f"other: {' '.join(argv[:2])[:40]}"
    return f"SLURM {what}" if slurm else what


def processes(rows: list[dict]) -> dict[str, dict]:
    """Per kind: processes started, processes that logged their exit, and their core seconds."""
    ends = {r["pid"]: r for r in rows if "cpu" in r}
    kinds: dict[str, dict] = collections.defaultdict(lambda: {"started": 0, "ended": 0, "cpu": 0.0})
    for r in rows:
        if r.get("start"):
            end = ends.get(r["pid"])
            k = kinds[kind((end or r)["argv"], r["slurm"])]
            k["started"] += 1
            if end is not None:
                k["ended"] += 1
                k["cpu"] += end["cpu"]
    return dict(kinds)


def report(found: dict, wall: float, cores: float | None, summary: str, top: int = 30,
           pythons: dict[str, dict] | None = None) -> str:
    tests, files = found["tests"], found["files"]
    used = sum(f["cpu"] + f["slurm"] for f in files.values())
    cap = f"capped at {cores} cores" if cores else f"{os.cpu_count()} cores, uncapped"
    lines = ["# Where the suite's CPU goes", "",
             f"`python benchmarks/suite_census.py{f' --cores {cores}' if cores else ''}`, "
             f"{time.strftime('%Y-%m-%d')}, {cap}: {summary}", "",
             f"{used:.0f} core seconds in {wall:.0f} s of wall"
             + (f": {used / (cores * wall):.0%} of what the cap allows." if cores else "."), "",
             "| file | wall s | CPU s (its worker) | CPU s (SLURM tasks) |", "|---|---|---|---|"]
    for name, f in sorted(files.items(), key=lambda x: -(x[1]["cpu"] + x[1]["slurm"]))[:top]:
        lines.append(f"| {name} | {f['wall']:.0f} | {f['cpu']:.0f} | {f['slurm']:.0f} |")
    lines += ["", "| test | wall s | CPU s |", "|---|---|---|"]
    for name, t in sorted(tests.items(), key=lambda x: -(x[1]["cpu"] + x[1].get("slurm", 0)))[
            :top]:
        lines.append(f"| {name} | {t['wall']:.0f} | {t['cpu'] + t.get('slurm', 0):.0f} |")
    if pythons:
        lines += ["", "Python processes by kind (CPU of those that exited normally; a forked "
                  "child's from its fork):", "",
                  "| kind | started | exited normally | CPU s | CPU s each |", "|---|---|---|---|---|"]
        for name, k in sorted(pythons.items(), key=lambda x: -x[1]["cpu"])[:top]:
            each = k["cpu"] / k["ended"] if k["ended"] else 0.0
            lines.append(f"| {name} | {k['started']} | {k['ended']} | {k['cpu']:.0f} | {each:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cores", type=float, help="CFS quota for pytest and slurmd")
    parser.add_argument("--out", type=Path, default=Path("suite-census.md"))
    parser.add_argument("pytest", nargs="*", help="after --: arguments for pytest")
    args = parser.parse_args(argv)
    if not ACCT.is_dir() or os.geteuid() != 0:
        print("suite_census: needs root and cgroup v1's cpuacct (/sys/fs/cgroup/cpuacct)",
              file=sys.stderr)
        return 2
    slurmd = subprocess.run(["pgrep", "slurmd"], capture_output=True, text=True).stdout.split()
    for pid in slurmd:
        _join(ACCT / f"{GROUP}-slurm", int(pid))
    cap = CPU / GROUP
    cap.mkdir(exist_ok=True)
    (cap / "cpu.cfs_period_us").write_text("100000")
    (cap / "cpu.cfs_quota_us").write_text(str(int(args.cores * 100000)) if args.cores else "-1")
    for pid in [*slurmd, str(os.getpid())]:  # pytest, started below, is this process's child
        _join(cap, int(pid))
    log = args.out.with_suffix(".jsonl").resolve()
    pythons_log = args.out.with_suffix(".processes.jsonl").resolve()
    for old in (log, pythons_log):
        old.unlink(missing_ok=True)
    site = Path(tempfile.mkdtemp(prefix="suite-census-"))
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    # the workers import this module from the checkout's root, their folder
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, LOG_ENV: str(log), PROCESS_LOG_ENV: str(pythons_log), "PYTHONPATH": path}
    start = time.time()
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "benchmarks.suite_census",
                           *args.pytest], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.time() - start
    for pid in [*slurmd, str(os.getpid())]:  # out of the cap again
        _join(CPU, int(pid))
    tail = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else f"exit {done.returncode}"
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    pythons = ([json.loads(line) for line in pythons_log.read_text().splitlines()]
               if pythons_log.exists() else [])
    args.out.write_text(report(census(rows), wall, args.cores, tail, pythons=processes(pythons)))
    print(f"{tail}\nwrote {args.out} ({len(rows)} reports, {log})")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
