"""`python -m ascend_pd diff`: what a change of a stack file does to a running cluster, without the
CLI, a backend or the cluster. Exit codes: 0 no change, 10 changes, 2 invalid configuration (or a
base that cannot be read)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Optional, TextIO

from .compare import Change, compare
from ..engine.preview import PreviewError, read as read_preview
from .. import term
from .report import as_json, markdown, text, text_blocks
from .sources import Side, SourceError, at_ref, from_file, working_tree

NO_CHANGE, CHANGES, INVALID = 0, 10, 2
FORMATS = {"text": text, "markdown": markdown, "json": as_json}


def exit_code(change: Change) -> int:
    if change.problems is not None:
        return INVALID
    return CHANGES if change.changed else NO_CHANGE


def run(stack: str, *, project_dir: Path, base: Optional[str] = None, base_file: Optional[Path] = None,
        fmt: str = "text", out: Optional[TextIO] = None, err: Optional[TextIO] = None,
        progress: Callable[[str], None] = lambda _: None, preview_json: Optional[Path] = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    engine = None
    try:
        if preview_json is not None:
            engine = read_preview(preview_json, stack=stack)
        if base_file is not None:
            old = from_file(stack, base_file, project_dir)
        else:
            old = at_ref(stack, base or "HEAD", project_dir)
    except (SourceError, PreviewError) as exc:
        print(f"ascend-pd diff: {exc}", file=err)
        return INVALID
    with term.phases(err) as say:
        change = compare(stack, old, working_tree(stack, project_dir), progress=lambda what: (say(what), progress(what)),
                         engine=engine)
    if change.problems is not None and fmt == "text":
        print(text(change), file=err)  # what `render` and `status` do with an invalid stack
    elif fmt == "text":
        term.write(text_blocks(change), out)
    else:
        print(FORMATS[fmt](change), file=out)
    return exit_code(change)


__all__ = ["run", "compare", "exit_code", "Change", "Side", "NO_CHANGE", "CHANGES", "INVALID", "FORMATS"]
