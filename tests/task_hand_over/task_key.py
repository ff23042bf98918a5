"""Which zygote a SLURM task's environment may be forked from (``tests/task_zygote.py``): one
started with the same environment, as the imports read it. And the fault ``helpers.inject`` wrote
into that environment, which a task runs as it starts wherever it was forked from."""

import hashlib
import os
import sys

# the folder of the zygotes' sockets (PYTEST_: what the SLURM tests submit with keeps it)
ZYGOTES_ENV = "PYTEST_REPRODUCE_TASK_ZYGOTES"
TASK_MODULE = "reproduce.launch.task_process"
# the sitecustomize of a fault ``helpers.inject`` wrote
INJECTED = "REPRODUCE_TEST_INJECTED"
# besides what the CLI's imports do not read (spawner.READ_LATER): what SLURM and submitit set in
# a task's environment (TMPDIR too, which a task's process reads afresh: task_zygote.become)
TASK_LATER = ("SLURMD_", "SRUN_", "PMI_", "PMIX_", "SUBMITIT_", "ENVIRONMENT", "HOSTNAME", "PWD",
              "OLDPWD", "SHLVL", "_", "TMPDIR")


def key(env: dict[str, str], later: tuple[str, ...]) -> str:
    """The environment as the imports read it: every variable but those read ``later``, and
    PYTHONPATH without this folder and an injected fault's."""
    own = {os.path.dirname(os.path.abspath(__file__))}
    if env.get(INJECTED):
        own.add(os.path.dirname(os.path.abspath(env[INJECTED])))
    path = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                           if p and os.path.abspath(p) not in own)
    kept = sorted((k, v) for k, v in {**env, "PYTHONPATH": path}.items()
                  if not k.startswith(later))
    return hashlib.sha1(repr(kept).encode()).hexdigest()[:16]


def run_injected() -> None:
    """Run the fault's sitecustomize, if the environment names one, as Python would have run it
    first: with its folder on the path. A child forked from a zygote (``tests/zygote.py``,
    ``tests/task_zygote.py``) and a task handed over by ``sitecustomize`` call it as they start."""
    if injected := os.environ.get(INJECTED):
        sys.path.insert(1, os.path.dirname(injected))
        with open(injected) as code:
            exec(compile(code.read(), injected, "exec"), {"__name__": "sitecustomize"})
