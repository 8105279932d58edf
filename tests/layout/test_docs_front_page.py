"""The README is a user's front page, and every page it leads to is in the repository: no link that goes
nowhere, no figure without the benchmark output it came from, no calibration story in a user's page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def links(page: Path) -> list[str]:
    """The targets of the page's Markdown links and images, code blocks left out."""
    return LINK.findall(FENCE.sub("", page.read_text()))


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def test_the_readme_is_a_front_page_of_at_most_100_lines() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 100, f"README.md has {len(lines)} lines: move sections to docs/"


def prose(page: Path) -> str:
    """The page without fenced code blocks and inline code: what a reader reads as sentences."""
    return re.sub(r"`[^`]*`", "", FENCE.sub("", page.read_text()))


# Words of the calibration story, which is not user documentation: what an engineer changing the simulator
# needs is on docs/engineering.md, the one page exempt. (Code such as a ``seed=`` argument is left out.)
STORY = re.compile(r"\b(seeds?|seed's|rounds?|round's)\b|\bload (average )?[~≈≤<>]?\s?\d", re.I)
ENGINEERING = ROOT / "docs" / "engineering.md"


@pytest.mark.parametrize(
    "page", [page for page in PAGES if page != ENGINEERING], ids=lambda page: str(page.relative_to(ROOT))
)
def test_no_user_page_tells_the_calibration_story(page: Path) -> None:
    found = [line.strip()[:100] for line in prose(page).splitlines() if STORY.search(line)]
    assert not found, f"{page.relative_to(ROOT)}: {found}"


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda page: page.name)
def test_every_docs_page_opens_with_what_its_reader_does_with_it(page: Path) -> None:
    lines = [line for line in page.read_text().splitlines() if line.strip()]
    assert lines[0].startswith("# "), f"{page.name} opens with its title"
    opening = lines[1]
    assert not opening.startswith(("#", "|", "```", "-", "!", "<")), f"{page.name}: {opening!r}"
    assert re.search(r"\b(you|your|read this|use this|an operator|a user|whoever)\b", opening, re.I), (
        f"{page.name} should open with what its reader does with it: {opening!r}"
    )


# User pages kept free of lab notes (which run, when, on how loaded a machine, for which issue): those go to
# docs/engineering.md, and a figure's provenance to its docs/bench/ output. Left out, each for its reason:
LAB_NOTES_ALLOWED = {
    "engineering.md": "the engineering page, where they belong",
    "benchmarks.md": "names the simulator's calibration check, a configuration of bench.capacity",
    "settings.md": "generated from the settings' own descriptions",
}
LAB_NOTE_FREE = [page for page in sorted((ROOT / "docs").glob("*.md")) if page.name not in LAB_NOTES_ALLOWED]
LAB_NOTE = re.compile(
    r"\bcalibration('s)?\b|\b20\d\d-\d\d-\d\d\b|\bissue \d+|\bload \(\d|\bloaded machine|\bshared with\b"
    r"|\bcommit [0-9a-f]{7}|\bnothing else running|development machine",
    re.I,
)


@pytest.mark.parametrize("page", LAB_NOTE_FREE, ids=lambda page: page.name)
def test_the_behaviour_pages_name_no_run_date_issue_or_machine_load(page: Path) -> None:
    found = [line.strip()[:100] for line in prose(page).splitlines() if LAB_NOTE.search(line)]
    assert not found, f"{page.relative_to(ROOT)}: lab notes belong on docs/engineering.md: {found}"


FIGURE = re.compile(r"(?<![\w-])\d[\d,.]*\s?(%|ms\b|s\b|MB\b|GB\b|min\b|/min\b|tokens?/s\b|keyframes)")


def test_every_figure_in_the_readme_links_to_its_benchmark_output() -> None:
    for line in prose(ROOT / "README.md").splitlines():
        if not FIGURE.search(line):
            continue
        artefacts = [target for target in LINK.findall(line) if target.startswith("docs/bench/")]
        assert artefacts, f"a figure without its benchmark output: {line.strip()!r}"
        for target in artefacts:
            text = (ROOT / target).read_text().lower()
            missing = [field for field in ("command", "date", "machine") if field not in text]
            assert not missing, f"{target} does not say its {missing}"


def test_the_readme_starts_with_the_two_commands_and_leads_to_the_architecture() -> None:
    text = (ROOT / "README.md").read_text()
    assert text.index("make serve") < text.index("## A first request")
    assert "make test" in text
    assert "docs/architecture.md" in links(ROOT / "README.md")


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    linked = {(ROOT / target).resolve() for target in links(ROOT / "README.md")}
    pages = set((ROOT / "docs").glob("*.md"))
    assert pages, "docs/ has no pages"
    assert not pages - linked, f"not linked from README.md: {sorted(p.name for p in pages - linked)}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if ROOT not in resolved.parents and resolved != ROOT:
            broken.append(f"{target} (outside the repository)")
        elif not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_nothing_in_the_repository_points_at_a_design_document_outside_it() -> None:
    outside = re.compile(r"DESIGN\.md|\.\./shared|/work/shared")
    found = [
        str(path.relative_to(ROOT))
        for folder in ("gateway", "shaping", "quality", "deploy", "bench", "tests", "docs", "scripts")
        for path in (ROOT / folder).rglob("*")
        if path.is_file() and path.suffix in {".py", ".md", ".yaml", ".yml", ".txt", ".html", ".toml", ""}
        and path != Path(__file__).resolve() and outside.search(path.read_text(errors="replace"))
    ]
    assert not found, f"points outside the repository: {found}"
    assert not outside.search((ROOT / "README.md").read_text()), "README.md points outside the repository"
