"""Script diffs a reviewer can read: every embedded copy of a shared library file
(`ascend_pd/shell/*.sh`, and the Python helpers beside them) is collapsed to one marker line, so
a script's diff shows only its own lines, and a library that changed is shown once for the whole
report instead of once per script that embeds it."""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

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


__all__ = ["library_texts", "collapse", "unified", "library_changes", "marker", "Collapsed"]
