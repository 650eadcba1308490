"""A failed `pulumi up` ends with the engine's report, not a Python traceback.

When a resource fails, the engine cancels the run and the Python language host sends the program
SIGINT. A program still waiting on that resource's outputs (an `apply`, as the worker's create waits
on etcd's id, components.transport) then died with a KeyboardInterrupt traceback, printed twice at the
end of every such failed run (issue 39). The checkout's `__main__.py` installs
`exit_quietly_when_cancelled` first. The same small program (a local Command that fails, one that
depends on its output, one that keeps the run going) runs with the real CLI twice, without and with it:
the first shows the traceback this guards against, the second does not."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import engine as eng

pytestmark = pytest.mark.integration

PROGRAM = """import pulumi
{quiet}from pulumi_command import local

failing = local.Command("fails", create="sleep 1; echo boom >&2; exit 1")
local.Command("slow", create="sleep 6; echo ok")
local.Command("after", create=failing.stdout.apply(lambda out: "echo " + out))
"""
QUIET = "from ascend_pd.program import exit_quietly_when_cancelled\nexit_quietly_when_cancelled()\n"


def failed_up(workdir: Path, *, quiet: bool) -> str:
    workdir.mkdir()
    (workdir / "state").mkdir()
    (workdir / "Pulumi.yaml").write_text(
        f"name: exit-check\nruntime:\n  name: python\n  options:\n    toolchain: pip\n    virtualenv: {eng.VENV}\n")
    (workdir / "__main__.py").write_text(PROGRAM.format(quiet=QUIET if quiet else ""))
    cli = str(eng.find_cli())
    env = {**os.environ, "PULUMI_BACKEND_URL": f"file://{workdir / 'state'}", "PULUMI_CONFIG_PASSPHRASE": "x",
           "PULUMI_SKIP_UPDATE_CHECK": "true", "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
           "PYTHONPATH": str(eng.PROJECT_DIR)}
    subprocess.run([cli, "stack", "init", "dev", "--non-interactive"], cwd=workdir, env=env, check=True,
                   capture_output=True, timeout=120)
    up = subprocess.run([cli, "up", "--yes", "--skip-preview", "--non-interactive"], cwd=workdir, env=env,
                        capture_output=True, text=True, timeout=300)
    assert up.returncode != 0, up.stdout[-3000:]
    out = up.stdout + up.stderr
    assert 'running "sleep 1; echo boom >&2; exit 1"' in out, out[-3000:]  # the engine names what failed
    return out


def test_a_failed_up_shows_the_engines_error_and_no_traceback(tmp_path: Path):
    why = eng.missing()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and the real engine cannot run: {why}", pytrace=False)
        pytest.skip(why)
    bare = failed_up(tmp_path / "bare", quiet=False)
    assert "KeyboardInterrupt" in bare  # what the program printed before
    quiet = failed_up(tmp_path / "quiet", quiet=True)
    assert "KeyboardInterrupt" not in quiet and "Traceback" not in quiet, quiet[-3000:]
    assert "error: update failed" in quiet
