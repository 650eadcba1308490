"""The real-engine suite: the `pulumi` CLI and providers against real nodes (sshd + dockerd each).

Without the CLI or root the suite skips with one line saying how to get them; under CI=true it
fails instead, so CI never passes without having run it (cluster.require_real_engine).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture(scope="module")
def realdir(request: pytest.FixtureRequest):
    """A fresh directory for one module's fleet and project (short: socket paths live under it)."""
    name = Path(request.node.name).stem.replace("test_", "")[:10]
    d = Path(tempfile.mkdtemp(prefix=f"apd-re-{name}-", dir="/tmp"))
    yield d
    if not os.environ.get("ASCEND_PD_KEEP_TMP"):
        import shutil

        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch):
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "*")
