"""Tracked files speak of the code as it is: no issue numbers, work periods, work items, checkouts or
files named by period or revision, and no paths that exist only on one machine.  Why a choice was made
belongs in the file, said as a fact; when it was made and by which piece of work belongs in git's log.

The scan reads every text file `git ls-files` lists (binary files and the test data are skipped)."""
import os
import re
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (what it is, pattern over a file's text); case-insensitive.
TEXT_RULES = [
    ("issue number", r"\bissues? ?#?\d+"),
    ("work period", r"\bsessions? \d+"),
    ("work item", r"\b(?:items?|defects?) \d+\b"),
    ("checkout name", r"\bworktrees?\b"),
    ("colleagues", r"\bother engineers?\b"),
    ("lock talk", r"\bexclusive holds?\b"),
    ("period-named file",
     r"(?-i:[\w.-]*(?:-(?:s|v|run|quiet)\d+|-sweep[A-Z]|issue\d+)[\w.-]*\.(?:md|jsonl?|txt|png))\b"),
    ("machine-local path", r"(?<![\w.$}])/(?:work|home|Users|root)/\w"),
    ("machine-local path", r"(?<![\w.$}])/tmp/\w"),
]
# A file's own name: no period or revision labels (a name ending in -s<N>, -v<N>, -run<N>, -quiet<N>,
# -sweep<LETTER>, or holding issue<N>).
NAME_RULE = re.compile(r"(?:-(?:s|v|run|quiet)\d+|-sweep[A-Z]|issue\d+)(?:[-_.]|$)", re.I)

# Matches that are legitimate: (path, text of the match).  Keep it short.
ALLOWED = {
    # the lock file that keeps two real-Slurm test clusters off one machine at a time
    ("tests/slurm_real.py", "/tmp" "/g"),  # (split, so that this line is no match itself)
}
SKIP_PREFIXES = ("tests/data/",)
_COMPILED = [(what, re.compile(rx, re.I)) for what, rx in TEXT_RULES]


def scan_text(path: str, text: str):
    """[(path, line number, what, matched text)] for each process word or local path in `text`."""
    found = []
    if NAME_RULE.search(os.path.basename(path)):
        found.append((path, 0, "period-named file", os.path.basename(path)))
    for lineno, line in enumerate(text.splitlines(), 1):
        for what, rx in _COMPILED:
            for m in rx.finditer(line):
                if (path, m.group(0)) not in ALLOWED:
                    found.append((path, lineno, what, m.group(0)))
    return found


def scan_file(root: str, path: str):
    with open(os.path.join(root, path), "rb") as f:
        data = f.read()
    if b"\0" in data:
        return []  # binary (images, pickles)
    return scan_text(path, data.decode("utf-8", errors="replace"))


def tracked_files(root: str = REPO):
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p and not p.startswith(SKIP_PREFIXES)]


def test_no_process_words_in_tracked_files():
    if not os.path.isdir(os.path.join(REPO, ".git")) and not os.path.isfile(os.path.join(REPO, ".git")):
        pytest.skip("not a git checkout")
    found = [hit for p in tracked_files() if os.path.isfile(os.path.join(REPO, p)) for hit in scan_file(REPO, p)]
    assert not found, "say why as a fact about the code, not when or by which work:\n" + "\n".join(
        f"{p}:{n}: {what}: {text!r}" for p, n, what, text in found[:60])


def test_scanner_catches_planted_words(tmp_path):
    planted = {
        "a.py": "# fixed in " + "issue" + " 19\n",
        "b.md": "measured in " + "session" + " 9 (see bench-x-s" + "11.md)\n",
        "c.txt": "data under /wo" + "rk/shared/x and /tm" + "p/scratch\n",
        "bench-cluster-s" + "11.md": "fine text\n",
    }
    for name, text in planted.items():
        (tmp_path / name).write_text(text)
    hits = {name: [what for _, _, what, _ in scan_file(str(tmp_path), name)] for name in planted}
    assert hits["a.py"] == ["issue number"]
    assert hits["b.md"] == ["work period", "period-named file"]
    assert hits["c.txt"] == ["machine-local path", "machine-local path"]
    assert hits["bench-cluster-s" + "11.md"] == ["period-named file"]
    # ordinary words that resemble them are not flagged
    clean = "pytest's session fixtures; namespaces gemu-s0; a helper thread; sessions of training; issues\n"
    assert scan_text("ok.py", clean) == []
