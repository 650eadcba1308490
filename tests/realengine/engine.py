"""The real Pulumi engine, driven as an operator drives it: the `pulumi` CLI built from
the toolchain sources beside the repository (setup.sh builds it and puts it in venv/bin) or installed the usual way, the command and
docker provider plugins of the pinned SDKs, a local `file://` state backend and a passphrase.

`Project` is a Pulumi project directory of its own (Pulumi.yaml naming this checkout's venv, the
checkout's `__main__.py`, one `Pulumi.<stack>.yaml`) so the committed stack files are never
touched. Every operation goes through the SDK's Automation API, which runs the same CLI commands
(`pulumi up --yes`, `preview`, `refresh --yes`, `destroy --yes`) and hands back the engine's own
event stream: each step's op and URN, in the order the engine ran them, with the time this
process saw it start and end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, Optional

import yaml

PROJECT_DIR = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent
PASSPHRASE = "ascend-pd-test"  # the throw-away state's passphrase: the test's secrets are throw-away too
# The plugins the pinned SDKs ask the engine for (requirements.txt pins them; test_pins.py keeps
# these equal to what build.sh installs).
PLUGINS = {"command": "pulumi_command", "docker": "pulumi_docker"}
HOW_TO_GET = ("no pulumi CLI with the pinned plugins: run setup.sh (it builds them from the toolchain sources beside the checkout, or "
              "set ASCEND_PD_TOOLCHAIN_SRC), or install pulumi {cli} and `pulumi plugin install resource "
              "command {command}` / `docker {docker}`")


def sdk_versions() -> dict[str, str]:
    return {"cli": version("pulumi"), "command": version("pulumi-command"), "docker": version("pulumi-docker")}


def find_cli() -> Optional[Path]:
    """The `pulumi` binary: on PATH, else beside this interpreter (setup.sh links it into venv/bin)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), str(Path(sys.executable).parent)])
    found = shutil.which("pulumi", path=path)
    return Path(found) if found else None


def missing() -> Optional[str]:
    """None when the real engine can run here, else one line saying what to do."""
    cli = find_cli()
    want = sdk_versions()
    if cli is None:
        return HOW_TO_GET.format(**want)
    env = {**os.environ, "PULUMI_SKIP_UPDATE_CHECK": "true"}
    got = subprocess.run([str(cli), "version"], capture_output=True, text=True, env=env, timeout=60).stdout.strip()
    if got.lstrip("v") != want["cli"]:
        return f"{cli} is pulumi {got}, the SDK is {want['cli']}: " + HOW_TO_GET.format(**want)
    plugins = subprocess.run([str(cli), "plugin", "ls"], capture_output=True, text=True, env=env, timeout=60).stdout
    have = {tuple(line.split()[:3]) for line in plugins.splitlines() if line.strip()}
    for name in PLUGINS:
        if (name, "resource", want[name]) not in have:
            return f"plugin {name} {want[name]} is not installed: " + HOW_TO_GET.format(**want)
    return None


def resource_key(urn: str) -> str:
    """`<type chain>::<name>` of a URN, without stack, project or the stack's own type: the same for a
    resource in the real engine's URNs and in the SDK mocks' (`urn:pulumi:stack::project::pulumi:pulumi:Stack$...`)."""
    _, _, chain, name = urn.split("::", 3)
    prefix = "pulumi:pulumi:Stack$"
    return f"{chain[len(prefix):] if chain.startswith(prefix) else chain}::{name}"


@dataclass
class Step:
    op: str  # the engine's op: create, update, replace, delete, same, refresh, create-replacement, ...
    urn: str
    type: str
    started: float  # time.monotonic() when the engine announced it
    finished: Optional[float] = None
    failed: bool = False
    diffs: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.urn.rsplit("::", 1)[-1]

    @property
    def seconds(self) -> float:
        return (self.finished or self.started) - self.started


@dataclass
class Run:
    """One engine operation: what it reported, step by step."""

    kind: str
    seconds: float = 0.0
    steps: list[Step] = field(default_factory=list)
    summary: dict[str, int] = field(default_factory=dict)
    stdout: str = ""
    diagnostics: list[str] = field(default_factory=list)
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def acting(self, types: tuple[str, ...] = ()) -> list[Step]:
        """Steps that changed something (not `same`, not reads), optionally of some resource types."""
        return [s for s in self.steps if s.op not in ("same", "read", "refresh")
                and (not types or s.type in types)]

    def ops(self, types: tuple[str, ...] = ()) -> list[tuple[str, str]]:
        return [(s.op, s.name) for s in self.acting(types)]


class Project:
    """A Pulumi project directory running this checkout's program against one stack."""

    def __init__(self, workdir: Path, stack: str, *, ssh_config: Optional[Path] = None, parallel: int = 16) -> None:
        from pulumi import automation as auto

        self.auto = auto
        self.dir = workdir
        self.stack_name = stack
        self.parallel = parallel
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "state").mkdir(exist_ok=True)
        (workdir / "Pulumi.yaml").write_text(yaml.safe_dump({
            "name": "ascend-pd",
            "description": "ascend-pd under the real-engine tests",
            "runtime": {"name": "python", "options": {"toolchain": "pip", "virtualenv": str(VENV)}},
        }, sort_keys=False))
        shutil.copy(PROJECT_DIR / "__main__.py", workdir / "__main__.py")
        self.env = {
            "PULUMI_BACKEND_URL": f"file://{workdir / 'state'}",
            "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            "NO_PROXY": "*",
        }
        if ssh_config:
            # pulumi-docker runs the local `ssh`: the fleet's keys and known hosts stand where an
            # operator's ~/.ssh/config would (OpenSSH reads ~ from the password database, not $HOME).
            wrap = workdir / "bin"
            wrap.mkdir(exist_ok=True)
            (wrap / "ssh").write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {ssh_config} "$@"\n')
            (wrap / "ssh").chmod(0o755)
            self.env["PATH"] = os.pathsep.join([str(wrap), str(find_cli().parent), os.environ.get("PATH", "")])
        cli = find_cli()
        # PulumiCommand runs ROOT/bin/pulumi: the resolved binary's prefix (the toolchain cache, or
        # wherever an operator's pulumi lives), so the CLI missing() checked is the one that runs.
        cmd = auto.PulumiCommand(root=str(cli.resolve().parent.parent), skip_version_check=True)
        self.stack = auto.create_or_select_stack(
            stack_name=stack, work_dir=str(workdir),
            opts=auto.LocalWorkspaceOptions(work_dir=str(workdir), pulumi_command=cmd, env_vars=self.env))

    @property
    def stack_file(self) -> Path:
        return self.dir / f"Pulumi.{self.stack_name}.yaml"

    def configure(self, settings: dict[str, Any], *, private_key: Optional[str] = None,
                  secrets: Optional[dict[str, str]] = None) -> None:
        """Write the stack's settings as an operator writes them (YAML objects under `ascend-pd:`),
        then the SSH key and `secrets` (setting path -> value: `proxyApiKey`, `vllm.env.HF_TOKEN`) as
        encrypted secrets with `pulumi config set --secret [--path]`."""
        doc = yaml.safe_load(self.stack_file.read_text()) if self.stack_file.exists() else {}
        doc = doc or {}
        kept = {k: v for k, v in (doc.get("config") or {}).items() if k == "ascend-pd:sshPrivateKey"}
        doc["config"] = {**{f"ascend-pd:{k}": v for k, v in settings.items()}, **kept}
        self.stack_file.write_text(yaml.safe_dump(doc, sort_keys=False, width=200))
        if private_key is not None:
            self.stack.set_config("ascend-pd:sshPrivateKey", self.auto.ConfigValue(value=private_key, secret=True))
        for path, value in (secrets or {}).items():
            self.stack.set_config(f"ascend-pd:{path}", self.auto.ConfigValue(value=value, secret=True),
                                  path="." in path)

    # -- operations ----------------------------------------------------------------------------

    def _run(self, kind: str, call, **kw) -> Run:
        run = Run(kind)
        lock = threading.Lock()
        by_urn: dict[str, Step] = {}
        out: list[str] = []

        def on_event(e) -> None:
            now = time.monotonic()
            with lock:
                if e.resource_pre_event:
                    m = e.resource_pre_event.metadata
                    op = m.op.value if hasattr(m.op, "value") else str(m.op)
                    s = Step(op=op, urn=m.urn, type=m.type, started=now, diffs=tuple(m.diffs or ()))
                    run.steps.append(s)
                    by_urn[m.urn + op] = s
                elif e.res_outputs_event:
                    m = e.res_outputs_event.metadata
                    op = m.op.value if hasattr(m.op, "value") else str(m.op)
                    s = by_urn.get(m.urn + op)
                    if s:
                        s.finished = now
                elif e.res_op_failed_event:
                    m = e.res_op_failed_event.metadata
                    op = m.op.value if hasattr(m.op, "value") else str(m.op)
                    s = by_urn.get(m.urn + op)
                    if s:
                        s.finished, s.failed = now, True
                elif e.diagnostic_event and e.diagnostic_event.severity in ("error", "warning"):
                    run.diagnostics.append(f"{e.diagnostic_event.severity}: {e.diagnostic_event.message.strip()}")
                elif e.summary_event:
                    run.summary = {k: int(v) for k, v in (e.summary_event.resource_changes or {}).items()}

        t0 = time.monotonic()
        try:
            result = call(on_event=on_event, on_output=out.append, color="never", **kw)
            run.stdout = getattr(result, "stdout", "") or "\n".join(out)
        except self.auto.CommandError as exc:
            run.error = str(exc)
            run.stdout = "\n".join(out)
        run.seconds = time.monotonic() - t0
        return run

    def preview(self, *, expect_no_changes: bool = False, diff: bool = True) -> Run:
        return self._run("preview", self.stack.preview, expect_no_changes=expect_no_changes, diff=diff,
                         parallel=self.parallel)

    def up(self, **kw) -> Run:
        return self._run("up", self.stack.up, parallel=self.parallel, show_secrets=False, **kw)

    def refresh(self) -> Run:
        return self._run("refresh", self.stack.refresh, parallel=self.parallel, show_secrets=False)

    def destroy(self, **kw) -> Run:
        return self._run("destroy", self.stack.destroy, parallel=self.parallel, show_secrets=False, **kw)

    def preview_json(self) -> dict[str, Any]:
        """`pulumi preview --json`, as a reviewer or the PR workflow runs it: the engine's planned steps
        (op, URN, the properties that differ) as one JSON document, the input of `diff --preview-json`."""
        cli = find_cli()
        p = subprocess.run([str(cli), "preview", "--json", "--non-interactive", "--stack", self.stack_name,
                            "--parallel", str(self.parallel)], cwd=str(self.dir), capture_output=True, text=True,
                           env={**os.environ, **self.env}, timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"pulumi preview --json exited {p.returncode}: {p.stderr[-3000:]}{p.stdout[-3000:]}")
        return json.loads(p.stdout)

    def outputs(self) -> dict[str, Any]:
        return {k: v.value for k, v in self.stack.outputs().items()}

    def export(self) -> dict[str, Any]:
        """The stack's state (`pulumi stack export`)."""
        return self.stack.export_stack().deployment
