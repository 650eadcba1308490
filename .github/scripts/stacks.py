"""The stacks of the project: one per `Pulumi.<stack>.yaml` beside `Pulumi.yaml`, discovered, never listed.

`python3 stacks.py --preview` prints, as a JSON list, the stacks the PR workflow's preview job
runs: every stack file, or the names in the repository variable PULUMI_PREVIEW_STACKS (space or
comma separated) when it is set, each of which must have a stack file.

Standard library only: it runs on a bare runner before anything is installed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

STACK_FILE = re.compile(r"Pulumi\.([A-Za-z0-9][A-Za-z0-9._-]*)\.yaml")


def stack_of(filename: str) -> str | None:
    m = STACK_FILE.fullmatch(filename)
    return m.group(1) if m else None


def head_stacks(project_dir: Path) -> list[str]:
    """The stacks whose file is in the working tree."""
    return sorted(s for s in (stack_of(p.name) for p in project_dir.glob("Pulumi.*.yaml")) if s)


def base_stacks(base: str, project_dir: Path) -> list[str]:
    """The stacks whose file is in the commit `base` (the top directory of the repository)."""
    out = subprocess.run(["git", "ls-tree", "--name-only", base], cwd=project_dir, check=True,
                         capture_output=True, text=True).stdout
    return sorted(s for s in (stack_of(line.strip()) for line in out.splitlines()) if s)


def preview_stacks(project_dir: Path, wanted: str) -> list[str]:
    have = head_stacks(project_dir)
    if not wanted.strip():
        return have
    names = [n for n in re.split(r"[\s,]+", wanted.strip()) if n]
    unknown = [n for n in names if n not in have]
    if unknown:
        raise SystemExit(f"PULUMI_PREVIEW_STACKS names {unknown}, which have no stack file; stack files: {have}")
    return sorted(set(names))


def main(argv: list[str]) -> int:
    if argv != ["--preview"]:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(preview_stacks(Path.cwd(), os.environ.get("PULUMI_PREVIEW_STACKS", ""))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
