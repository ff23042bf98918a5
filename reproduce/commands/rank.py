"""``python -m reproduce _rank-run PAYLOAD``: one rank of a multi-device run, started by
``train.devices.train_on_ranks`` (not for users: it has no subparser, and --help omits it)."""

from __future__ import annotations

NAME = "_rank-run"


def run_rank(payload: str) -> int:
    from reproduce.train import devices, runner
    from reproduce.util.logs import quiet_libraries

    quiet_libraries()
    return devices.rank_main(payload, runner.run_here)
