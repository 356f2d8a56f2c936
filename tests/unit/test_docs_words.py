"""The docs speak of the code and date their figures, never by the work sessions or rounds
that produced them: a reader has no sessions."""

import re
from pathlib import Path

DOCS = Path(__file__).parents[2] / "docs"
# "session 3", "sessions 4-5", "this session", "same-session", "this round", ... A session in
# the code's own sense (a conversation's `session`, pytest's test session) is not matched.
PROCESS_WORDS = re.compile(
    r"\bsessions?\s+\d|\b(this|last|that|same|one|previous|next|the)[ -]sessions?\b"
    r"|\b(this|last|that|previous|next|the) round\b|\bround before\b",
    re.IGNORECASE,
)


def test_no_page_dates_anything_by_session_or_round():
    found = [
        f"{path.relative_to(DOCS)}:{number}: {line.strip()}"
        for path in sorted(DOCS.rglob("*.md"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if PROCESS_WORDS.search(line)
    ]
    assert found == []


def test_the_pattern_finds_what_it_is_for():
    for text in ("session 5, final code", "Sessions 4-5", "a same-session A/B", "this round"):
        assert PROCESS_WORDS.search(text), text
    for text in ("the test session's shared Ray", "session=None", "x-trinity-session"):
        assert not PROCESS_WORDS.search(text), text


def test_the_mkdocs_banner_is_explained_with_the_variable_its_package_reads():
    """mkdocs prints a third-party notice; the tests-and-benchmarks page explains it and
    names the variable that silences it, which must be the one the installed package reads
    (a renamed variable would leave the page wrong), and CI sets it."""
    from importlib.util import find_spec

    page = (DOCS / "getting-started" / "tests-and-benchmarks.md").read_text()
    ci = (DOCS.parent / ".ci" / "run").read_text()
    for module, variable in (("material.templates", "NO_MKDOCS_2_WARNING"),):
        source = Path(find_spec(module).origin).read_text()
        assert f'"{variable}"' in source or f"'{variable}'" in source, (module, variable)
        assert variable in page and variable in ci, variable
