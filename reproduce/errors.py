"""The errors a user sees as one line (``error: ...``, exit 2): what is wrong and what is allowed."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


def one_line(e: BaseException, limit: int = 200) -> str:
    """``e`` as one line for a message: its type and the first line of its text, cut at
    ``limit`` characters (a compiler's or a library's error may run to pages)."""
    first = (str(e).strip().splitlines() or [""])[0][:limit]
    return f"{type(e).__name__}: {first}"


class ConfigError(ValueError):
    """A config that cannot be built; the message is one line naming the field and what is allowed."""


class DataError(ValueError):
    """A corpus, file or setting that cannot be used; the one-line message says what is allowed."""


class SpecError(ConfigError):
    """A sweep spec that cannot be used; the message names the file and the key."""


class ParsingDataError(DataError):
    """A treebank that cannot be found or read."""


class DamagedRecords(Exception):
    """Damaged records were set aside while rendering or counting: the command exits non-zero."""


class RankFailure(RuntimeError):
    """A multi-device run stopped because one of its ranks failed or was killed."""


class Diverged(RuntimeError):
    """A run's training loss turned non-finite: it stops there, with nothing evaluated or
    recorded (``train.callbacks.StopOnDivergence``, ``records.diverged``)."""

    def __init__(self, run_id: str, step: int, last_finite: float | None):
        self.run_id, self.step, self.last_finite = run_id, step, last_finite
        last = f"{last_finite:.4g}" if last_finite is not None else "none"
        super().__init__(f"{run_id}: diverged: the training loss is not finite by step {step} "
                         f"(last finite loss {last})")


class Stopped(SystemExit):
    """A run stopped by a signal (SIGTERM, SLURM's USR2) at the end of a step, saved there: exit 1
    with the message; ``signal`` says which (``launch.task`` requeues on USR2), ``step`` where,
    ``work`` the run folder it trained in."""

    def __init__(self, message: str, signum: int, step: int | None = None,
                 work: Path | None = None):
        super().__init__(message)
        self.signal, self.step, self.work = signum, step, work


class OutOfMemory(RuntimeError):
    """A run's training ran out of device memory: one line naming the run and the micro-batch to
    lower; its checkpoints are kept and the claim released, so the same command resumes."""

    def __init__(self, run_id: str, device: str, micro_batch_tokens: int, detail: str = ""):
        first = detail.strip().splitlines()[0][:120] if detail.strip() else ""
        super().__init__(
            f"{run_id}: out of memory on {device} while training with micro-batches of "
            f"{micro_batch_tokens} tokens ({first}). Lower train.device_batch_tokens (in the "
            f"spec or the scale, or --set train.device_batch_tokens={max(1, micro_batch_tokens // 2)}"
            "): the tokens per step stay the same, by accumulation. Run the command again to "
            "resume from the last checkpoint")


class DiskError(RuntimeError):
    """A folder a run writes to is full or read-only: one line naming it. Every write is atomic
    (``util.files.write_atomic``), so nothing half-written is left; the claim is released and the
    same command resumes from the last checkpoint once there is room."""

    def __init__(self, what: str, error: OSError):
        import errno
        import os

        folder = os.path.dirname(error.filename) if error.filename else "its folder"
        name = errno.errorcode.get(error.errno or 0, "")
        super().__init__(f"{what}: cannot write to {folder}: {error.strerror} ({name}). Nothing "
                         "was left half-written; make room (or make it writable) and run the "
                         "command again: it resumes from the last checkpoint")


class NoRoom(RuntimeError):
    """A run not started because its checkpoints would not fit on the disk (``records.disk``):
    one line (exit 2) with what they need, what is free and how to go on."""
