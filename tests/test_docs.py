"""The documentation, checked: the configuration page is the one the settings generate, the
README stays a newcomer's page, and every relative link leads to a file that exists."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from autoloop.config.loading import build_settings
from autoloop.config.reference import EXAMPLE_TOML, REGENERATE, configuration_markdown

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 250
# [text](target) and ![alt](target), the target up to the first space (a title may follow).
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)")


def pages() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def test_the_configuration_page_is_the_generated_one():
    written = (ROOT / "docs" / "configuration.md").read_text()
    assert written == configuration_markdown(), (
        f"docs/configuration.md is not what the settings generate; regenerate it: {REGENERATE}")


def test_the_configuration_example_is_valid():
    # The example is shown to be copied: every key in it must be a setting, every value valid.
    table = tomllib.loads(EXAMPLE_TOML)["tool"]["autoloop"]
    build_settings({key.replace("-", "_"): value for key, value in table.items()})


def test_the_readme_stays_short():
    count = len(README.read_text().splitlines())
    assert count <= MAX_README_LINES, (
        f"README.md has {count} lines, more than {MAX_README_LINES}: move the detail into a page of docs/")


def relative_links(page: Path) -> list[str]:
    """The link targets of a page that are not URLs, outside code blocks and code spans."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.IGNORECASE)]


def test_every_relative_link_leads_to_a_file():
    broken = []
    for page in pages():
        for target in relative_links(page):
            where = f"{page.relative_to(ROOT)}: ({target})"
            if "#" in target:
                # A heading's anchor changes silently when the heading does; link the page.
                broken.append(f"{where} has an anchor")
            elif not (page.parent / target).exists():
                broken.append(f"{where} leads to no file")
    assert not broken, "\n".join(broken)


def test_the_readme_links_every_page_of_docs():
    linked = {(README.parent / t).resolve() for t in relative_links(README)}
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"README.md does not link docs/{', docs/'.join(missing)}"


def test_the_readme_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci.startswith("python -m pytest"), ci
    assert ci in README.read_text(), f"README.md does not give CI's test command: {ci}"


def test_the_quick_start_installs_what_the_morning_needs():
    """The README's one command installs the extra that draws progress.png: a newcomer's
    first `autoloop report` has its picture, not a line saying matplotlib is missing."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    needed = {name for name, deps in extras.items() if any(d.startswith("matplotlib") for d in deps)} - {"test"}
    quick = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    installs = re.findall(r'pip install -e "?\.(?:\[([\w,]+)\])?"?', quick)
    assert installs, quick
    assert {"plot"} <= needed and all(needed & set(i.split(",")) for i in installs), (installs, needed)
