"""The user documentation holds together: every relative link of a tracked markdown page resolves, and
every page under docs/ is reachable from docs/README.md by following links."""
import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _tracked_md():
    out = subprocess.run(["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [REPO / p for p in out.split()]


def _links(page: Path):
    for target in LINK.findall(page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        yield Path(os.path.normpath(page.parent / target))


def test_relative_links_resolve():
    broken = [f"{p.relative_to(REPO)} -> {t}" for p in _tracked_md() for t in _links(p) if not t.exists()]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_reachable_from_the_index():
    docs = REPO / "docs"
    pages = {p for p in _tracked_md() if docs in p.parents}
    seen, todo = set(), [docs / "README.md"]
    while todo:
        page = todo.pop()
        if page in seen or not page.exists():
            continue
        seen.add(page)
        todo += [t for t in _links(page) if t.suffix == ".md"]
    unreachable = sorted(str(p.relative_to(REPO)) for p in pages - seen)
    assert not unreachable, "not reachable from docs/README.md: " + ", ".join(unreachable)
