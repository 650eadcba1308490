"""Every script the committed stacks render passes shellcheck: each node's create and delete text,
the exact commands Pulumi sends (the SSH/`docker exec` heredoc wrappers around them, linted as POSIX
sh: they run in the SSH user's login shell), and the static bash libraries as they are on disk."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ascend_pd import scripts, shell
from ascend_pd.loader import PROJECT_DIR, load_stack
from ascend_pd.plan import build_plan

STACKS = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in PROJECT_DIR.glob("Pulumi.*.yaml"))

pytestmark = pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")


def rendered(stack: str) -> dict[str, str]:
    plan = build_plan(load_stack(stack), stack)
    out: dict[str, str] = {}
    for node in plan.nodes:
        for n, s in enumerate(scripts.node_scripts(plan, node.name)):
            for kind in ("create", "delete"):
                text = getattr(s, kind)
                out[f"{node.name}/{n:02d}-{s.name}.{kind}.sh"] = text
                if s.where == "host":
                    wrapped = shell.on_host(text)
                else:
                    wrapped = shell.in_container(plan.cfg.container.name, text, lock=scripts.script_locks(plan).of(s.name),
                                                 delete=kind == "delete")
                out[f"{node.name}/{n:02d}-{s.name}.{kind}.pulumi.sh"] = "#!/bin/sh\n" + wrapped
    return out


def test_stacks_exist():
    assert {"a2-8node", "a3-4node"} <= set(STACKS)


@pytest.mark.parametrize("stack", STACKS)
def test_every_rendered_script_passes_shellcheck(stack: str, tmp_path: Path):
    files = []
    for name, text in rendered(stack).items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        files.append(str(path.relative_to(tmp_path)))
    assert len(files) > 20
    # No --shell: each file's shebang says which (bash scripts, sh wrappers).
    proc = subprocess.run(["shellcheck", "--severity=style", *files], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"shellcheck findings in {stack}:\n{proc.stdout}{proc.stderr}"


def test_static_libraries_pass_shellcheck_as_they_are():
    libs = sorted(str(p) for p in Path(shell.__file__).parent.glob("*.sh"))
    assert {Path(p).name for p in libs} >= {"lib.sh", "worker_lib.sh", "group_lib.sh", "probe_lib.sh"}
    proc = subprocess.run(["shellcheck", "--severity=style", *libs], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("stack", STACKS)
def test_every_script_is_strict(stack: str):
    for name, text in rendered(stack).items():
        if name.endswith(".pulumi.sh"):
            continue
        assert text.startswith("#!/usr/bin/env bash\n"), name
        assert "\nset -euo pipefail\n" in text, name


def test_etcd_image_mode_gate_passes_shellcheck(tmp_path: Path):
    cfg = load_stack("a3-4node")
    cfg = cfg.model_copy(update={"etcd": cfg.etcd.model_copy(update={"image": "quay.io/coreos/etcd:v3.5.12"})})
    gate = scripts.etcd(build_plan(cfg, "a3-4node"))
    assert "docker logs" in gate.create
    for kind in ("create", "delete"):
        text = getattr(gate, kind)
        assert "\nset -euo pipefail\n" in text
        (tmp_path / f"{kind}.sh").write_text(text)
    proc = subprocess.run(["shellcheck", "--shell=bash", "--severity=style", "create.sh", "delete.sh"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
