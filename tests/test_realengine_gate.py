"""The real-engine suite (tests/realengine/) skips on a clone without the Pulumi CLI, saying how to
get it, and fails instead under CI=true: CI can never pass without having run it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "realengine"))

import cluster  # noqa: E402
import engine  # noqa: E402


def test_without_a_cli_the_suite_skips_with_how_to_get_one(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(engine, "find_cli", lambda: None)
    monkeypatch.setattr(cluster.nodes, "can_run", lambda: None)
    with pytest.raises(pytest.skip.Exception) as skipped:
        cluster.require_real_engine()
    assert "setup.sh" in str(skipped.value) and "pulumi plugin install" in str(skipped.value)


def test_under_ci_a_missing_cli_fails(monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(engine, "find_cli", lambda: None)
    monkeypatch.setattr(cluster.nodes, "can_run", lambda: None)
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        cluster.require_real_engine()


def test_a_cli_of_another_version_is_not_taken(monkeypatch, tmp_path):
    fake = tmp_path / "pulumi"
    fake.write_text("#!/bin/sh\necho v3.100.0\n")
    fake.chmod(0o755)
    monkeypatch.setattr(engine, "find_cli", lambda: fake)
    why = engine.missing()
    assert why and "v3.100.0" in why and engine.sdk_versions()["cli"] in why


def test_the_node_init_script_passes_shellcheck():
    import shutil
    import subprocess

    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (setup.sh installs it)")
    script = Path(__file__).resolve().parent / "realengine" / "node_init.sh"
    proc = subprocess.run(["shellcheck", "--severity=style", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
