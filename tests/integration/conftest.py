"""Fixtures for the integration suite: real etcd, real openYuanrong workers, fake vLLM ranks and a
fake PD proxy, driven by the exact scripts the plan renders (see run_harness.py).

Everything runs under one short temporary directory per test module (Unix socket paths of the
worker must stay under 108 bytes) and on loopback addresses 127.0.1.x. Whatever a test leaves
running is killed afterwards: by pid file, then by scanning /proc for our process names started
under that directory or on our addresses, even when the test failed.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
if str(PROJECT) not in sys.path:  # `pytest` without `python -m` does not put the cwd on sys.path
    sys.path.insert(0, str(PROJECT))
HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import run_harness as harness  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "integration: runs rendered scripts against real etcd/openYuanrong and fake vLLM processes "
        "(slow; deselect with -m 'not integration')",
    )


@pytest.fixture(scope="module")
def workdir(request: pytest.FixtureRequest):
    """A short, fresh directory for one test module; everything started under it is killed at the end."""
    name = Path(request.node.name).stem.replace("test_", "")[:12]
    tmp = Path(tempfile.mkdtemp(prefix=f"apd-{name}-", dir="/tmp"))
    yield tmp
    harness.cleanup(tmp)
    if os.environ.get("ASCEND_PD_KEEP_TMP"):
        print(f"\nkept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_stray_environment(monkeypatch: pytest.MonkeyPatch):
    """The test process talks to loopback services directly (requests/etcd3gw honour *_proxy)."""
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "*")
