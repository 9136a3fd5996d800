"""The documentation as a whole: the README stays a front page whose Quickstart is what CI
runs, the architecture page stays a map, and the MkDocs site (mkdocs.yml, docs/) builds with
``--strict``: every page in the nav, no broken link or reference, no test marker shown.

Every code block of these pages runs in tests/docs/test_readme.py.
"""
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

README_MAX_BYTES = 12 * 1024        # a front page: what it is, install, examples, links
ARCHITECTURE_MAX_BYTES = 20 * 1024  # a map: the detail lives in docs/design/
BUILD_TIMEOUT_S = 240
SITE_NEEDS = {"mkdocs": "mkdocs", "material": "mkdocs-material", "mkdocstrings_handlers.python": "mkdocstrings-python"}


def test_readme_is_a_front_page():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, (f"README.md is {size:,} bytes, more than {README_MAX_BYTES:,}: "
                                      f"move what users study into the site (docs/)")


def test_architecture_is_a_map():
    size = len((DOCS / "architecture.md").read_bytes())
    assert size <= ARCHITECTURE_MAX_BYTES, (f"docs/architecture.md is {size:,} bytes, more than "
                                            f"{ARCHITECTURE_MAX_BYTES:,}: move detail into docs/design/")


def _fenced_blocks(text: str):
    return re.findall(r"^```[a-z]*\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)


def test_quickstart_is_what_ci_runs():
    """The README's Quickstart commands are exactly lines .ci/run runs, so that what a new user
    types is what CI checks on a fresh clone."""
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## Quickstart\n")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else len(text)]
    blocks = [b for b in _fenced_blocks(section) if "python -m pytest" in b]
    assert len(blocks) == 1, "the Quickstart has one block with the suite's command"
    commands = [line.split("#", 1)[0].strip() for line in blocks[0].splitlines() if line.strip()]
    assert commands == ["pip install -e '.[test]' && shmrdv demo", "python -m pytest"]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    for command in commands:
        assert command in ci, f".ci/run does not run the Quickstart's {command!r}"


def _nav_pages(nav) -> list:
    pages = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_page_is_in_the_nav():
    yaml = pytest.importorskip("yaml", reason="PyYAML (installed with mkdocs) reads mkdocs.yml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages, "docs/ pages and the nav of mkdocs.yml differ"
    assert len(nav) == len(set(nav)), "a page is twice in the nav"


@pytest.mark.timeout(BUILD_TIMEOUT_S + 60)
def test_site_builds_strict(tmp_path):
    for module, package in SITE_NEEDS.items():
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{package} is not installed (pip install -e '.[docs]'): the site cannot be built")
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    built = [p for p in site.rglob("*") if p.suffix in (".html", ".json")]
    assert any(p.name == "index.html" for p in built)
    shown = [p.relative_to(site).as_posix() for p in built if "readme-test" in p.read_text(errors="replace")]
    assert not shown, f"test markers reached the site (docs/hooks.py drops them): {shown}"
