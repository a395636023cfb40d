"""The code cites the project's own documents, and each citation leads somewhere: a file of
`docs/` that exists and, for `docs/X.md §N`, a numbered section N in it. A reader of the
repository has nothing else, so a citation of a document outside it is a dead end."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
SOURCES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
for folder, pattern in (("src", "*.py"), ("src", "*.js"), ("src", "*.css"), ("src", "*.html")):
    SOURCES += sorted((ROOT / folder).rglob(pattern))
SOURCES += sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "bench").rglob("*.py"))
SOURCES += sorted((ROOT / "docs").glob("*.md"))

OUTSIDE = re.compile(r"\b(API|ARCHITECTURE)\.md\b|shared/spec")
CITATION = re.compile(r"docs/([a-z_-]+\.md)(?: §(\d+))?")


def _sections(doc: Path) -> set[str]:
    return set(re.findall(r"^## (\d+)\. ", doc.read_text(encoding="utf-8"), re.MULTILINE))


def test_nothing_cites_a_document_outside_the_repository() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in SOURCES
        if path != Path(__file__)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert found == []


def test_every_citation_of_docs_names_a_file_and_section_that_exist() -> None:
    broken = []
    for path in SOURCES:
        for name, section in CITATION.findall(path.read_text(encoding="utf-8")):
            doc = ROOT / "docs" / name
            if not doc.is_file() or (section and section not in _sections(doc)):
                broken.append(f"{path.relative_to(ROOT)}: docs/{name} §{section}")
    assert broken == []
