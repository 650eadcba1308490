"""heal's SSH runner is doctor's transport: an unreachable node is a failed command with the reason,
bounded by the connect timeout, never a hang or a traceback."""

from __future__ import annotations

import shutil
import time

import pytest

from ascend_pd import heal
from ascend_pd.loader import cli_config_map, load_config
from ascend_pd.plan import build_plan


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client (setup.sh installs openssh-client)")
def test_unreachable_node_is_a_failed_command_with_the_reason():
    plan = build_plan(load_config(cli_config_map("a3-4node")), "a3-4node")  # 192.0.2.x: TEST-NET, nobody answers
    run = heal.ssh_runner(plan, connect_timeout_s=1)
    t0 = time.monotonic()
    rc, out, err = run("d0", "echo should-not-run", 15)
    assert time.monotonic() - t0 < 15  # 1.3 s measured: the connect timeout, not the command's
    assert rc == 255 and "should-not-run" not in out
    assert f"d0: unreachable over ssh root@{plan.node('d0').address}:22" in err, err
