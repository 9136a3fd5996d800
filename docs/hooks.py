"""MkDocs hook: drop the markers that tell tests/docs/test_readme.py how to run a
code block (``<!-- readme-test: ... -->``, one line each), so that they reach
neither the rendered pages nor the search index."""
import re

MARKER = re.compile(r"^[ \t]*<!--\s*readme-test:.*?-->[ \t]*\n", re.MULTILINE)


def on_page_markdown(markdown: str, **kwargs: object) -> str:
    return MARKER.sub("", markdown)
