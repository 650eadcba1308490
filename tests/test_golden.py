"""Golden files: every node's rendered scripts for each committed stack, so a PR diff shows what
changes on which node without cluster access. `UPDATE_GOLDEN=1 pytest tests/test_golden.py`
rewrites them after an intended change."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ascend_pd.loader import load_stack
from ascend_pd.plan import build_plan
from ascend_pd.render import write_scripts

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("stack", ["a2-8node", "a3-4node"])
def test_rendered_scripts_match_golden(stack, tmp_path):
    plan = build_plan(load_stack(stack), stack)
    write_scripts(plan, tmp_path)
    rendered = {p.relative_to(tmp_path): p.read_text() for p in sorted(tmp_path.rglob("*.sh"))}
    golden_dir = GOLDEN / stack
    if os.environ.get("UPDATE_GOLDEN") == "1":
        for old in golden_dir.rglob("*.sh"):
            old.unlink()
        for rel, text in rendered.items():
            (golden_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (golden_dir / rel).write_text(text)
    golden = {p.relative_to(golden_dir): p.read_text() for p in sorted(golden_dir.rglob("*.sh"))}
    assert sorted(rendered) == sorted(golden), "scripts added or removed: rerun with UPDATE_GOLDEN=1 and review the diff"
    changed = [str(rel) for rel in rendered if rendered[rel] != golden[rel]]
    assert not changed, f"rendered scripts differ from tests/golden/{stack}: {changed[:10]} (UPDATE_GOLDEN=1 to accept)"
