"""The pages agree with the records: every rendered table is what its generator makes of results/
now (README's results block: tests/test_results.py), and every relative link in README.md and
docs/ leads somewhere."""

import re
from pathlib import Path

import pytest

from reproduce.runs.records import load_records
from reproduce.runs.sweep import load_spec
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
