"""The repository as its users read it: every link in the docs resolves inside the repository,
and no file carries the development process's bookkeeping (issue or session numbers): history
lives in git, work in progress in the tracker."""

import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def tracked_files():
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [ROOT / line for line in out.splitlines() if (ROOT / line).is_file()]


# [text](target) links, not images of URLs; the target up to a space or ')'.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for path in tracked_files():
        if path.suffix != ".md":
            continue
        for target in LINK.findall(path.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            resolved = (path.parent / target.split("#")[0]).resolve()
            if not resolved.exists() or ROOT not in resolved.parents:
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, "links that do not resolve inside the repository:\n" + "\n".join(broken)


def test_no_file_points_outside_the_repository():
    outside = []
    for path in tracked_files():
        if path == pathlib.Path(__file__).resolve():
            continue
        if path.suffix in {".md", ".txt", ".py", ".sh", ".cpp", ".hpp", ".cu", ".cuh", ".cmake"}:
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if "../shared/" in line:
                    outside.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not outside, "references to files outside the repository:\n" + "\n".join(outside)


# The word issue(s) or session(s), any case, then a number (with or without "#"); not a range
# such as a version or a date.
BOOKKEEPING = re.compile(r"\b(issues?|sessions?) #?\d+(?![\d-])", re.IGNORECASE)


def test_the_bookkeeping_pattern_finds_numbered_work():
    # Samples built from parts, so that this file itself stays clean of them.
    samples = [("issue", "42"), ("Issues", "16 and 18"), ("session", "#25"), ("Session", "9:")]
    for word, number in samples:
        assert BOOKKEEPING.search(f"see {word} {number}"), (word, number)
    assert not BOOKKEEPING.search("issues that matter, session-long runs, release 0.1.0")


def test_no_issue_or_session_numbering_in_the_tree():
    found = []
    for path in tracked_files():
        if path.suffix in {".json", ".jsonl", ".png"}:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if BOOKKEEPING.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not found, "issue or session numbers in the tree:\n" + "\n".join(found)
