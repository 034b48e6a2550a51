"""What the sources say about themselves: no references to numbered development sessions, no
commit hashes, and no files outside the repository, in README.md, docs/ (bar the generated
docs/results.md), tuner/, tests/ and benchmarks/ (its results/ data aside). A figure is stated
with how it was measured, not cited from a run or a file a user does not have.

The rules, per line of every .py, .md, .toml and .sh file there:

- a numbered session: "session" or "sessions", then spaces or a "#", then a number
  (case-insensitive);
- a commit hash: a word of 7 to 40 lowercase hex characters (git's abbreviated to full hashes)
  with at least one digit and at least one letter a-f, not inside a longer word or identifier
  (a letter, digit or underscore on either side). So a sha256 (64 characters) is never one,
  nor 0x7fffffff (an x before it), a number (no letter) or a word like "deadbeef" (no digit);
- a file outside the repository: the shared folder beside the checkout or the bench notes kept
  there (OUTSIDE).

This file spells its examples of offences in pieces, so that it passes its own scan.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCANNED = ("docs", "tuner", "tests", "benchmarks")
SKIPPED = {REPO / "docs" / "results.md", REPO / "benchmarks" / "results"}  # generated, data
SUFFIXES = (".py", ".md", ".toml", ".sh")

SESSION = re.compile(r"\bsessions?\s*#?\d+", re.IGNORECASE)
HEX_WORD = re.compile(r"(?<![0-9A-Za-z_])[0-9a-f]{7,40}(?![0-9A-Za-z_])")
# spelled in two parts, so that this file does not name them itself
OUTSIDE = ("../" + "shared", "BENCH" + ".md")


def offences(text: str) -> list[tuple[int, str]]:
    """(line number, what) for every offence in text."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        found += [(number, f"numbered session {m.group()!r}") for m in SESSION.finditer(line)]
        for m in HEX_WORD.finditer(line):
            word = m.group()
            if re.search(r"\d", word) and re.search(r"[a-f]", word):
                found.append((number, f"commit hash {word!r}"))
        found += [(number, f"outside the repository {s!r}") for s in OUTSIDE if s in line]
    return found


def text_files(top: Path) -> Iterator[Path]:
    if top.is_file():
        yield top
        return
    for folder, dirs, names in os.walk(top):  # links to folders not followed
        dirs[:] = sorted(d for d in dirs if Path(folder, d) not in SKIPPED and d != "__pycache__")
        for name in sorted(names):
            path = Path(folder, name)
            if path.suffix in SUFFIXES and path not in SKIPPED:
                yield path


def report(paths: list[Path]) -> list[str]:
    return [
        f"{path.relative_to(REPO)}:{number}: {what}"
        for path in paths
        for number, what in offences(path.read_text(errors="replace"))
    ]


def test_the_checker_finds_each_kind_of_offence() -> None:
    sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    session, commit = "Sess" + "ion", "742" + "cbc5"
    full = (commit * 6)[:40]  # a full hash: 40 characters
    text = "\n".join(
        [
            "clean line: 0x7fffffff deadbeef 1234567 abc123 word_ab12cd34 " + sha256,
            f"the demo's run of {session} 14 on {commit} (dirty: {commit}-dirty)",
            "see " + OUTSIDE[1] + " and " + OUTSIDE[0] + "/hooks",
            f"{session.lower()}s 3-4, {session.lower()} #7, a {session.lower()} of 20 s",
            f"full hash {full}",
        ]
    )
    assert offences(text) == [
        (2, f"numbered session '{session} 14'"),
        (2, f"commit hash '{commit}'"),
        (2, f"commit hash '{commit}'"),
        (3, f"outside the repository {OUTSIDE[0]!r}"),
        (3, f"outside the repository {OUTSIDE[1]!r}"),
        (4, f"numbered session '{session.lower()}s 3'"),
        (4, f"numbered session '{session.lower()} #7'"),
        (5, f"commit hash '{full}'"),
    ]


def test_the_sources_name_no_session_commit_or_outside_file() -> None:
    paths = [p for top in SCANNED for p in text_files(REPO / top)]
    assert REPO / "tuner" / "policy.py" in paths and REPO / "docs" / "results.md" not in paths
    found = report(paths)
    assert not found, "\n".join(found)


def test_the_readme_names_no_session_commit_or_outside_file() -> None:
    found = report([REPO / "README.md"])
    assert not found, "\n".join(found)


README_LINES = 300  # a guide a newcomer reads through; reference pages live under docs/


def test_the_readme_is_a_guide_of_at_most_about_300_lines() -> None:
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_LINES, f"README.md has {lines} lines: move reference into docs/"
