"""The container preparation steps that install nothing, run for real: `install-etcd` (etcd is
present, so it only reports it) and the `patches-*` steps (`git am` onto a repository) against
throw-away git repositories laid out like the a3-4node stack's: one patch for `vllm`, a two-patch
series for `vllm-ascend` whose second patch edits what the first added (as the seed's
"Implement yuanrong backend" + "fix kv pool ... yuanrong backend handling" do).

The `pip-*` and `install-yuanrong` steps are not run: they install packages.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import run_harness as harness

pytestmark = pytest.mark.integration

NODE = "p1"
BASE = "def backend():\n    return None\n"
STEP_ONE = "def backend():\n    return 'yuanrong'\n"
STEP_TWO = "def backend():\n    return 'yuanrong'  # fixed\n"
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@localhost"}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True,
                          text=True).stdout


def make_repo(root: Path, name: str, versions: list[tuple[str, str]]) -> tuple[Path, list[str]]:
    """A repository at its base commit and the patches (git format-patch) of `versions`."""
    repo = root / name
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "backend.py").write_text(BASE)
    git(repo, "add", "backend.py")
    git(repo, "commit", "-qm", "base")
    for subject, text in versions:
        (repo / "backend.py").write_text(text)
        git(repo, "commit", "-qam", subject)
    out = root / f"{name}-patches"
    git(repo, "format-patch", "-q", f"-{len(versions)}", "-o", str(out))
    git(repo, "reset", "-q", "--hard", f"HEAD~{len(versions)}")
    return repo, [str(p) for p in sorted(out.glob("*.patch"))]


@pytest.fixture()
def prepared(tmp_path: Path):
    harness.require_tools("git")
    vllm, vllm_patches = make_repo(tmp_path, "vllm", [("Bugfix local cache hit", STEP_ONE)])
    ascend, ascend_patches = make_repo(tmp_path, "vllm-ascend", [
        ("Implement yuanrong backend", STEP_ONE), ("fix kv pool yuanrong backend handling", STEP_TWO)])
    c = harness.Cluster("a3-4node", tmp_path / "n", overrides={"container": {"prepare": [
        {"pip": ["transformers==5.2.0", "--no-deps", "--force-reinstall"]},
        {"repo": str(vllm), "patches": vllm_patches},
        {"repo": str(ascend), "patches": ascend_patches},
    ]}})
    return c, vllm, ascend


def subjects(repo: Path) -> list[str]:
    return git(repo, "log", "--format=%s").split("\n")[:-1]


def test_install_etcd_reports_the_present_binary(tmp_path: Path):
    harness.require_tools(harness.ETCD_BINARY)
    c = harness.Cluster("a3-4node", tmp_path)
    r = c.run(c.etcd_node, "install-etcd")
    assert r.stdout.startswith(f"etcd present on {c.etcd_node}: etcd Version:")


def test_steps_are_named_and_ordered_like_the_stack(prepared):
    c, _, _ = prepared
    names = [s.name for s in c.scripts(NODE) if s.where == "container"]
    assert names[:4] == ["install-yuanrong", "pip-transformers", "patches-vllm", "patches-vllm-ascend"]


def test_patch_steps_apply_every_patch_once(prepared):
    c, vllm, ascend = prepared
    r1 = c.run(NODE, "patches-vllm")
    r2 = c.run(NODE, "patches-vllm-ascend")
    assert "Applying: Bugfix local cache hit" in r1.stdout
    assert subjects(vllm)[0] == "Bugfix local cache hit"
    assert subjects(ascend)[:2] == ["fix kv pool yuanrong backend handling", "Implement yuanrong backend"]
    assert (ascend / "backend.py").read_text() == STEP_TWO
    # A single patch is recognised as applied on the next run.
    again = c.run(NODE, "patches-vllm")
    assert "already applied" in again.stdout and subjects(vllm).count("Bugfix local cache hit") == 1
    assert "Applying: Implement yuanrong backend" in r2.stdout
    assert "Applying: fix kv pool yuanrong backend handling" in r2.stdout


def test_patch_delete_restores_the_files(prepared):
    c, vllm, ascend = prepared
    c.run(NODE, "patches-vllm")
    c.run(NODE, "patches-vllm-ascend")
    c.run(NODE, "patches-vllm-ascend", "delete")
    c.run(NODE, "patches-vllm", "delete")
    assert (ascend / "backend.py").read_text() == BASE
    assert (vllm / "backend.py").read_text() == BASE


def test_patch_series_rerun_is_harmless(prepared):
    c, _, ascend = prepared
    c.run(NODE, "patches-vllm-ascend")
    r = c.run(NODE, "patches-vllm-ascend", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert subjects(ascend)[:3] == ["fix kv pool yuanrong backend handling", "Implement yuanrong backend", "base"]


def test_patch_create_after_delete_applies_again(prepared):
    c, vllm, _ = prepared
    c.run(NODE, "patches-vllm")
    c.run(NODE, "patches-vllm", "delete")
    r = c.run(NODE, "patches-vllm", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (vllm / "backend.py").read_text() == STEP_ONE


def test_changed_series_is_reapplied_from_the_base(prepared):
    """Dropping a patch from the series re-applies the rest onto the original commit."""
    c, _, ascend = prepared
    c.run(NODE, "patches-vllm-ascend")
    first = c.scripts(NODE)
    one_patch = [s for s in first if s.name == "patches-vllm-ascend"][0]
    assert one_patch.create.count(".patch") >= 2
    patches = sorted(str(p) for p in (ascend.parent / "vllm-ascend-patches").glob("*.patch"))
    c2 = harness.Cluster("a3-4node", c.tmp, overrides={"container": {"prepare": [
        {"repo": str(ascend), "patches": patches[:1]}]}})
    r = c2.run(NODE, "patches-vllm-ascend")
    assert "Applying: Implement yuanrong backend" in r.stdout
    assert subjects(ascend)[:2] == ["Implement yuanrong backend", "base"]
    assert (ascend / "backend.py").read_text() == STEP_ONE
