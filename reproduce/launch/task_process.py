"""A SLURM task's process, the command of each sbatch file ``--launcher slurm`` submits:
submitit's own job runner (``submitit.core._submit``: load the pickled call, run it, pickle its
result beside it), then the process ends as the CLI does (``util.exits.end``), without tearing
down torch and Lightning module by module (a core's 1.2 s a task). What the task does is
``launch.task``'s."""

from submitit.core.submission import submitit_main

from reproduce.util.exits import end

if __name__ == "__main__":
    end(submitit_main)
