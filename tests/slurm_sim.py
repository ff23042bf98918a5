"""A SLURM cluster simulated on this machine, for ``--launcher slurm`` end to end without one.

``install(folder)`` puts ``sbatch``, ``srun`` and ``scontrol`` on a PATH: ``sbatch`` keeps the
script submitit wrote and answers with a job id, ``scontrol`` writes down what it was asked
(``requeue``), and ``start(...)`` runs one array task of a kept script as SLURM would: its batch
script with the job's variables, whose ``srun`` starts one process per task (nodes x tasks per
node, every "node" on this machine) with the variables each task would get (``SLURM_PROCID``,
``SLURM_LOCALID``, ``SLURM_NODEID``, ...), and passes USR2 and SIGTERM on to them, as SLURM's
``--signal`` does."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

SBATCH = '''
import re, sys
from pathlib import Path
state = Path({state!r})
jobs = sorted(int(p.stem) for p in state.glob("*.sh"))
job = (jobs[-1] + 1) if jobs else 1000
(state / f"{{job}}.sh").write_text(Path(sys.argv[-1]).read_text())
print(f"Submitted batch job {{job}}")
'''

SCONTROL = '''
import sys
from pathlib import Path
with open(Path({state!r}) / "scontrol.log", "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
'''

SRUN = '''
import os, signal, subprocess, sys
args = sys.argv[1:]
files = {{}}
while args and args[0].startswith("--"):
    flag = args.pop(0)
    if flag in ("--output", "--error"):
        files[flag] = args.pop(0)
n, per_node = int(os.environ["SLURM_NTASKS"]), int(os.environ["SLURM_NTASKS_PER_NODE"])
job = os.environ.get("SLURM_ARRAY_JOB_ID", os.environ["SLURM_JOB_ID"])
task = os.environ.get("SLURM_ARRAY_TASK_ID", "0")
with open(os.path.join({state!r}, f"srun-{{job}}_{{task}}.pid"), "w") as f:
    f.write(str(os.getpid()))
procs = []
for t in range(n):
    name = lambda f: (files[f].replace("%A", job).replace("%a", task).replace("%t", str(t))
                      .replace("%j", os.environ["SLURM_JOB_ID"]))
    env = dict(os.environ, SLURM_PROCID=str(t), SLURM_LOCALID=str(t % per_node),
               SLURM_NODEID=str(t // per_node), SLURM_STEP_ID="0")
    for f in files:
        os.makedirs(os.path.dirname(name(f)), exist_ok=True)
    procs.append(subprocess.Popen(args, env=env, stdout=open(name("--output"), "a"),
                                  stderr=open(name("--error"), "a")))
def forward(signum, frame):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signum)
signal.signal(signal.SIGUSR2, forward)
signal.signal(signal.SIGTERM, forward)
codes = [p.wait() for p in procs]
sys.exit(max(abs(c) for c in codes))
'''


def install(folder: Path) -> dict[str, str]:
    """The simulated commands in ``folder/bin``; returns the environment entries that put them
    first on PATH."""
    bin_dir, state = folder / "bin", folder / "state"
    bin_dir.mkdir(parents=True, exist_ok=True)
    state.mkdir(exist_ok=True)
    for name, body in (("sbatch", SBATCH), ("scontrol", SCONTROL), ("srun", SRUN)):
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\n" + body.format(state=str(state)))
        path.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def jobs(folder: Path) -> list[int]:
    return sorted(int(p.stem) for p in (folder / "state").glob("*.sh"))


def requeued(folder: Path) -> list[str]:
    log = folder / "state" / "scontrol.log"
    return log.read_text().splitlines() if log.exists() else []


def srun_pid(folder: Path, job: int, task: int = 0) -> int | None:
    """The simulated ``srun`` of a started array task (signals sent to it reach every task)."""
    path = folder / "state" / f"srun-{job}_{task}.pid"
    return int(path.read_text()) if path.exists() else None


def start(folder: Path, job: int, env: dict[str, str], task: int = 0, restart: int = 0
          ) -> subprocess.Popen:
    """Array task ``task`` of job ``job`` (its ``restart``-th start), as SLURM would start it;
    its tasks meet on a free port of this machine."""
    script = (folder / "state" / f"{job}.sh").read_text()
    sbatch = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", script, re.M))
    nodes, per_node = int(sbatch.get("nodes", 1)), int(sbatch.get("ntasks-per-node", 1))
    array = ({"SLURM_JOB_ID": str(job * 100 + task), "SLURM_ARRAY_JOB_ID": str(job),
              "SLURM_ARRAY_TASK_ID": str(task)} if "array" in sbatch else {"SLURM_JOB_ID": str(job)})
    env = {**env, **array, "SLURM_JOB_NAME": sbatch["job-name"],
           "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_NNODES": str(nodes),
           "SLURM_NTASKS": str(nodes * per_node), "SLURM_NTASKS_PER_NODE": str(per_node),
           "SLURM_JOB_NODELIST": "localhost", "SLURM_NODELIST": "localhost",
           "SLURM_RESTART_COUNT": str(restart)}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        env["MASTER_PORT"], env["MASTER_ADDR"] = str(s.getsockname()[1]), "127.0.0.1"
    return subprocess.Popen(["bash", "-c", script], env=env, start_new_session=True)
