"""The pages agree with the records: every rendered table is what its generator makes of results/
now (README's results block: tests/tables/test_results.py), and every relative link in README.md and
docs/ leads somewhere."""

import re
import shlex
from pathlib import Path

import pytest

from reproduce.records.store import load_records
from reproduce.records.sweep import load_spec
from reproduce.tables import RENDERERS

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as '-'."""
    heads = re.findall(r"^#+\s+(.*)$", page.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def _broken(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#") and not target[1:]:
            continue  # a web address
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    assert _broken(page) == []


@pytest.mark.parametrize("table", ["table2", "table3", "table4"])
def test_rendered_tables_are_what_the_records_give(table):
    spec = load_spec(table)
    records = load_records(table, RESULTS, move=False)
    assert (RESULTS / f"{table}.md").read_text() == RENDERERS[spec.kind](spec, records), \
        f"results/{table}.md differs from its records: python -m reproduce {table} --render"


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n[ok](page.md#title) [gone](docs/docs/devices.md) [no](page.md#nope) "
                    "[web](https://example.org)\n")
    assert [line.split(":")[0] for line in _broken(page)] == ["docs/docs/devices.md", "page.md#nope"]


COMMAND = re.compile(r"python -m reproduce((?:[^\n`#]|\\\n)*)")


def _commands(text: str) -> list[str]:
    """Every ``python -m reproduce ...`` in a page, its continuation lines joined, with optional
    parts (``[--seeds 0 1 2]``) dropped and placeholders (``<GPU>``, ``$SCALE``, ``DIR``) given a
    value."""
    out = []
    parts = re.split(r"(^```.*?^```)", text, flags=re.MULTILINE | re.DOTALL)
    text = "".join(part if part.startswith("```") else  # an inline span across a line break
                   re.sub(r"`([^`\n]*)\n(?=[^`\n]*`)", r"`\1 ", part) for part in parts)
    for match in COMMAND.finditer(text.replace("\\\n", " ")):
        args = re.split(r"\s(?:>>?|\||&&?|;)|\)", match.group(1))[0]  # the shell's part after
        args = re.sub(r"\[[^\[\]]*\]", " ", args)
        args = re.sub(r"<[^<>]*>|\$\{?\w+\}?", "x", args).replace("...", " ")
        out.append(" ".join(args.split()))
    return out


def test_every_command_in_the_docs_parses(capsys):
    """Each command a page shows is one the CLI takes: its subcommand, flags and choices."""
    import shlex

    from reproduce.__main__ import build_parser
    from reproduce.commands import rank

    parser, wrong = build_parser(), []
    for page in PAGES:
        for args in _commands(page.read_text()):
            try:
                argv = shlex.split(args)
            except ValueError:
                continue  # a fragment quoted across lines of prose
            if not argv or argv[0] == rank.NAME:  # the hidden command a rank runs
                continue
            if len(argv) == 1:  # a command named in prose: its name only
                argv.append("--help")
            try:
                parser.parse_args(argv)
            except SystemExit as e:
                if e.code == 0:  # --help
                    capsys.readouterr()
                    continue
                wrong.append(f"{page.name}: python -m reproduce {args}: "
                             + capsys.readouterr().err.strip().splitlines()[-1])
    assert not wrong, "\n".join(wrong)


def test_a_wrong_command_in_a_page_is_found():
    assert _commands("run `python -m reproduce table3 --row A [--seeds 0 1]` or\n"
                     "python -m reproduce table3 --scale $SCALE \\\n  --render # note") == [
        "table3 --row A", "table3 --scale x --render"]
    assert _commands("see `python -m reproduce verify r.json --precision\nbf16-mixed`.") == [
        "verify r.json --precision bf16-mixed"]
    assert _commands("python -m reproduce table3 >> log 2>&1 &\n(python -m reproduce status &)") == [
        "table3", "status"]


def test_the_pages_a_user_reads_stay_short():
    """README and docs/ less the developer page: at most 20,000 words (whitespace-separated, as
    `wc -w` counts), so a new fact replaces an old diary rather than piling onto it."""
    user_pages = [p for p in PAGES if p.name != "developing.md"]
    words = sum(len(p.read_text().split()) for p in user_pages)
    assert words <= 20_000, f"{words} words in README.md and docs/ less developing.md"


def test_the_one_gpu_page_works_as_written(tmp_path, monkeypatch, capsys):
    """docs/one-gpu.md as a user with one GPU follows it, on this CPU: its download line is the
    one a run then finds by the corpus's name (the Hub-layout fixture, as the cluster recipe's
    test checks), its commands parse (``test_every_command_in_the_docs_parses``), and its table
    of costs is what ``table2 --scale paper --dry-run --on <GPU>`` prices now from the GPU
    measured in results/: a new measurement changes the prices, and this test, until the page
    follows."""
    from reproduce.__main__ import main
    from tests.end_to_end.test_slurm_cluster import _check_download

    page = (ROOT / "docs" / "one-gpu.md").read_text()
    downloads = [shlex.split(line.split("#")[0]) for line in page.splitlines()
                 if line.startswith(".venv/bin/hf download")]
    assert len(downloads) == 1
    _check_download(["hf", *downloads[0][1:]], tmp_path / "hf")
    monkeypatch.setenv("REPRODUCE_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("REPRODUCE_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    rows = re.findall(r"^\| (\S+)[^|]* \| ([\d.]+) h \| ([\d.]+) h \| ([\d.]+) h \| ([\d.]+) h \|$",
                      page, flags=re.MULTILINE)
    assert [gpu for gpu, *_ in rows] == ["H200", "H100", "A100"], rows
    for gpu, *cells in rows:
        assert main(["table2", "--variant", "base-en-de", "--variant", "big-en-de", "--scale",
                     "paper", "--dry-run", "--on", gpu]) == 0
        said = capsys.readouterr().out
        priced = []
        for variant in ("base-en-de", "big-en-de"):
            plan = said.split(f"table2-{variant}-paper-seed0: ", 2)[-1]
            priced += [re.search(r"-> ([\d.]+) h", plan).group(1),
                       re.search(r"the command ([\d.]+) h", plan).group(1)]
        assert priced == cells, f"--on {gpu}: the dry run prices {priced}, the page says {cells}"
