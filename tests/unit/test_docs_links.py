"""The documentation stays inside the repository and complete: every link and image of the
README and docs/ resolves to a file of the checkout, mkdocs.yml's nav lists pages that exist,
and the generated pages (configuration reference, veRL tables) cover what they claim to.
The site itself is built by `mkdocs build --strict` in .ci/run; these checks need no MkDocs."""

import re
import runpy
import typing
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import yaml
from pydantic import BaseModel

from trinity.common.config import Config
from trinity.common.config.convert_verl import ESTIMATORS, TABLE

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
# [text](target) and ![alt](target); the target ends at a space (a title) or ")".
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"""(?:href|src)=["']([^"']+)["']""")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code, where links are links."""
    text = re.sub(r"(?ms)^(```|~~~).*?^\1", "", text)
    return re.sub(r"`[^`\n]*`", "", text)


def links(page: Path) -> List[str]:
    text = prose(page.read_text())
    return LINK.findall(text) + HTML_LINK.findall(text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_images_resolve_inside_the_repository(page: Path) -> None:
    found = links(page)
    problems = []
    for target in found:
        path = target.split("#", 1)[0]
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith(("/", "//")):
            problems.append(f"{target}: not a relative link")
        elif path:
            resolved = (page.parent / path).resolve()
            if ROOT not in resolved.parents:
                problems.append(f"{target}: leaves the repository")
            elif not resolved.is_file():
                problems.append(f"{target}: no such file")
    assert not problems, f"{page.relative_to(ROOT)}: " + "; ".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_points_outside_the_repository(page: Path) -> None:
    """The spec files the project was built from are not part of a clone."""
    text = page.read_text()
    for outside in ("../shared", "/work/", "configuration-guide.md", "developer-guide.txt"):
        assert outside not in text, f"{page.relative_to(ROOT)} mentions {outside}"


def test_the_readme_links_into_docs() -> None:
    targets = {t.split("#", 1)[0] for t in links(ROOT / "README.md")}
    assert {"docs/reference/configuration.md", "docs/getting-started/quickstart.md"} <= targets
    assert all(t.startswith("docs/") for t in targets)


def nav_files(nav: Any) -> Iterator[str]:
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for item in nav:
            yield from nav_files(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from nav_files(value)


def test_mkdocs_nav_lists_existing_pages_and_every_page() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["docs_dir"] == "docs" and config["site_dir"] == "site"
    listed = list(nav_files(config["nav"]))
    assert len(listed) == len(set(listed))
    missing = [f for f in listed if not (DOCS / f).is_file()]
    assert not missing, f"nav lists pages that do not exist: {missing}"
    unlisted = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")} - set(listed)
    assert not unlisted, f"pages missing from the nav: {sorted(unlisted)}"


# ---- the generated pages -------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference() -> Dict[str, Any]:
    return runpy.run_path(str(DOCS / "gen_reference.py"), run_name="gen_reference")


def _sections(annotation: Any) -> Tuple[Any, str]:
    """(model class, path suffix) when ``annotation`` holds config sections, else (None, "")."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Union and len(args) == 1:
        annotation = args[0]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, ""
    if origin is list and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return args[0], "[i]"
    if origin is dict and isinstance(args[1], type) and issubclass(args[1], BaseModel):
        return args[1], ".<name>"
    return None, ""


def every_key(model: type = Config, prefix: str = "") -> Iterator[str]:
    """Every config field's dotted path; a stage's sections are the top-level ones."""
    for name, field in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        yield path
        child, suffix = _sections(field.annotation)
        if child is not None and not prefix.startswith("stages"):
            yield from every_key(child, path + suffix)


def test_reference_covers_every_config_field(reference: Dict[str, Any]) -> None:
    keys = list(every_key())
    assert len(keys) > 400
    assert [row.path for row in reference["rows"]()] == keys
    markdown = reference["reference_markdown"]().replace("<wbr>", "")
    absent = [
        k
        for k in keys
        if f"<code>{k.replace('<', '&lt;').replace('>', '&gt;')}</code>" not in markdown
    ]
    assert not absent, f"keys missing from the reference: {absent[:10]}"
    # every in-page link has its heading
    ids = set(re.findall(r"\{#([\w-]+)\}", markdown))
    assert set(re.findall(r'href="#([\w-]+)"', markdown)) <= ids


def test_reference_marks_what_does_not_run_here(reference: Dict[str, Any]) -> None:
    runs = {row.path: row.runs for row in reference["rows"]()}
    assert runs["model.rope_theta"] == "only unset; any other value: not supported yet"
    assert runs["trainer.trainer_strategy"] == "yes, except `megatron`: not supported yet"
    assert runs["synchronizer.sync_method"] == "yes"
    assert runs["mode"] == "yes"
    assert runs["stages[i].mode"] == runs["mode"]
    assert runs["trainer.save_strategy"].startswith("no effect here: ")
    # below an inert section, every key has no effect
    wrap = "trainer.trainer_config.actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params"
    assert runs[wrap].startswith("no effect here: ")
    assert runs["model.max_model_len"] == "yes"


def test_verl_tables_cover_the_converter() -> None:
    markdown = runpy.run_path(str(DOCS / "gen_verl.py"), run_name="gen_verl")["verl_markdown"]()
    for verl_key, trinity_key in TABLE.items():
        assert f"| `{verl_key}` | `{trinity_key}` |" in markdown
    for estimator, (algorithm, advantage) in ESTIMATORS.items():
        assert f"| `{estimator}` | `{algorithm}` | `{advantage}` |" in markdown
    moved = "| `trainer.trainer_config.actor_rollout_ref.actor.ppo_micro_batch_size` |"
    assert f"{moved} `ppo_micro_batch_size_per_gpu` |" in markdown


@pytest.mark.parametrize("script", ["gen_reference.py", "gen_verl.py", "gen_corpus.py"])
def test_committed_generated_pages_are_current(script: str) -> None:
    """The committed page is what its script writes now, so a reader of the repository sees
    the tables of this code: a field's doc changed without re-running the script fails here."""
    names = runpy.run_path(str(DOCS / script), run_name=script[:-3])
    page, expected = names["PAGE"], names["generated_page"]()
    assert "<!-- Generated below by" in expected and expected.count("\n| ") > 20
    assert page.read_text(encoding="utf-8") == expected, f"run: python docs/{script}"


def test_committed_earlier_releases_page_is_current() -> None:
    """The page of earlier releases' names is the tables of legacy.py as they are now."""
    names = runpy.run_path(str(DOCS / "gen_reference.py"), run_name="gen_reference")
    page, expected = names["EARLIER_PAGE"], names["generated_earlier_page"]()
    assert "`explorer.runner_num` | `explorer.runner_per_model`" in expected
    assert page.read_text(encoding="utf-8") == expected, "run: python docs/gen_reference.py"


@pytest.mark.parametrize("page", [ROOT / "README.md", DOCS / "index.md"], ids=lambda p: p.name)
def test_the_front_pages_list_every_guide(page: Path) -> None:
    listed = {Path(link).name for link in links(page)}
    guides = {guide.name for guide in (DOCS / "guides").glob("*.md")}
    assert guides - listed == set()
