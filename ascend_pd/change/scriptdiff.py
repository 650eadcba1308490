"""Script diffs a reviewer can read: every embedded copy of a shared library file
(`ascend_pd/shell/*.sh`, and the Python helpers beside them) is collapsed to one marker line, so
a script's diff shows only its own lines, and a library that changed is shown once for the whole
report instead of once per script that embeds it."""

from __future__ import annotations

import difflib
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ..shell import HERE, library, static_file

CONTEXT_LINES = 3


def library_texts(directory: Path = HERE) -> dict[str, str]:
    """file name -> the text a script embeds for it (`library()` strips a .sh file's header)."""
    out = {}
    for path in sorted(directory.glob("*.sh")):
        out[path.name] = library(path.stem)
    for path in sorted(directory.glob("*.py")):
        if path.name != "__init__.py":
            out[path.name] = static_file(path.name)
    return out


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def marker(name: str, text: str) -> str:
    return f"# [ascend_pd/shell/{name}: {len(text.splitlines())} lines, sha256 {digest(text)}]\n"


@dataclass(frozen=True)
class Collapsed:
    text: str
    libraries: dict[str, str]  # file name -> the embedded text, for every library found


def collapse(text: str, libraries: Mapping[str, str]) -> Collapsed:
    """`text` with every embedded library replaced by its marker line. Longest first: no library
    is a part of another, but a longer one must not lose a piece to a shorter match."""
    found = {}
    for name, body in sorted(libraries.items(), key=lambda kv: -len(kv[1])):
        if body.strip() and body in text:
            text = text.replace(body, marker(name, body))
            found[name] = body
    return Collapsed(text, found)


def unified(old: str, new: str, old_label: str, new_label: str) -> list[str]:
    return [line.rstrip("\n") for line in difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), old_label, new_label, n=CONTEXT_LINES)]


# A process's start fingerprint (shell.fingerprint: 16 hex digits) on the lines of the shared
# library's functions that take one. It changes with the command it covers, which the diff shows
# where the command changes: these lines are noise to a reviewer.
FINGERPRINTED = re.compile(r"\b(needs_start|running_with|started|step_done|mark_done)\b")
FINGERPRINT = re.compile(r"\b[0-9a-f]{16}\b")
HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@(.*)$")


def _masked(line: str) -> str:
    return FINGERPRINT.sub("<fingerprint>", line[1:]) if FINGERPRINTED.search(line) else line[1:]


def _hunks(diff: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    head, hunks = [], []
    for line in diff:
        if HUNK.match(line):
            hunks.append([line])
        elif hunks:
            hunks[-1].append(line)
        else:
            head.append(line)
    return head, hunks


def _changed_lines(hunk: Sequence[str]) -> tuple[str, ...]:
    return tuple(line for line in hunk[1:] if line[:1] in "+-")


def _renumbered(hunk: list[str]) -> list[str]:
    m = HUNK.match(hunk[0])
    body = hunk[1:]
    old_n = sum(1 for line in body if line[:1] in " -")
    new_n = sum(1 for line in body if line[:1] in " +")
    return [f"@@ -{m.group(1)},{old_n} +{m.group(2)},{new_n} @@{m.group(3)}"] + body


def drop_fingerprints(diff: Sequence[str]) -> tuple[list[str], int]:
    """`diff` without the changes that are only a process fingerprint (a removed line and an added
    one, paired in order, equal once their fingerprints are masked): the new line stays as context.
    Hunks left without a change are dropped. Returns the diff and how many line pairs went."""
    head, hunks = _hunks(diff)
    out, dropped = list(head), 0
    for hunk in hunks:
        body, i, kept = hunk[1:], 0, [hunk[0]]
        while i < len(body):
            if body[i][:1] != "-":
                kept.append(body[i])
                i += 1
                continue
            j = i
            while j < len(body) and body[j][:1] == "-":
                j += 1
            k = j
            while k < len(body) and body[k][:1] == "+":
                k += 1
            minus, plus = body[i:j], body[j:k]
            if len(minus) == len(plus):
                rest_minus, rest_plus, context = [], [], []
                for a, b in zip(minus, plus):
                    if FINGERPRINTED.search(a) and _masked(a) == _masked(b):
                        dropped += 1
                        context.append(" " + b[1:])
                    else:
                        rest_minus.append(a)
                        rest_plus.append(b)
                # Only when all pairs are fingerprints is the order of context lines exact.
                kept += (context if not rest_minus else minus + plus)
                if rest_minus:
                    dropped -= len(context)
            else:
                kept += minus + plus
            i = k
        if _changed_lines(kept):
            out += _renumbered(kept)
    if len(out) == len(head):
        return [], dropped  # nothing but fingerprints changed
    return out, dropped


def fold_repeats(diff: Sequence[str]) -> list[str]:
    """A hunk whose changed lines are the same as an earlier hunk's (the same flag on each of a
    node's ranks) is shown once, with a line naming where else it applies."""
    head, hunks = _hunks(diff)
    first: dict[tuple[str, ...], int] = {}
    again: dict[int, list[str]] = {}
    shown: list[list[str]] = []
    for hunk in hunks:
        key = _changed_lines(hunk)
        if key in first:
            m = HUNK.match(hunk[0])
            again[first[key]].append(m.group(2))
            continue
        first[key] = len(shown)
        again[len(shown)] = []
        shown.append(hunk)
    out = list(head)
    for n, hunk in enumerate(shown):
        out += hunk
        if again[n]:
            where = ", ".join(again[n][:8]) + (f" and {len(again[n]) - 8} more" if len(again[n]) > 8 else "")
            out.append(f"@@ the same change {len(again[n])} more time(s) in this script (new lines {where}) @@")
    return out


def library_changes(old: Iterable[Mapping[str, str]], new: Iterable[Mapping[str, str]]) -> dict[str, list[str]]:
    """Per library file whose embedded text differs between the two sides: its diff, once."""
    before: dict[str, str] = {}
    after: dict[str, str] = {}
    for found in old:
        before.update(found)
    for found in new:
        after.update(found)
    out = {}
    for name in sorted(set(before) & set(after)):
        if before[name] != after[name]:
            out[name] = unified(before[name], after[name], f"base/{name}", f"new/{name}")
    return out


__all__ = ["library_texts", "collapse", "unified", "library_changes", "marker", "Collapsed", "drop_fingerprints",
           "fold_repeats"]
