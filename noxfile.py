"""nox sessions: `nox -s tests`, `nox -s lint`, `nox -s bench`."""

import nox

nox.options.sessions = ["lint", "tests"]
# The CPU build of torch on the project's machines (a local wheel folder serves it); elsewhere
# install torch from PyTorch's CPU index first (README), or pip pulls a multi-GB CUDA build.
TORCH = "torch==2.13.0"


@nox.session
def tests(session: nox.Session) -> None:
    """README's test command, and the MarianMT checks (the ``bench`` extra) it skips."""
    session.install(TORCH, "-e", ".[dev,bench]")
    session.run("python", "-m", "pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.5")
    session.run("ruff", "check", "reproduce", "tests", "benchmarks", "noxfile.py")


@nox.session
def bench(session: nox.Session) -> None:
    """`nox -s bench` writes results/performance.md; `nox -s bench -- --quick` takes minutes."""
    session.install(TORCH, "-e", ".[bench]")
    session.run("python", "-m", "reproduce", "bench", *session.posargs)
