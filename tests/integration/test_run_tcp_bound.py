"""The firewall script's tcp_retries2 part (scripts.firewall.tcp_bound), run for real against a fake
/proc/sys/net/ipv4/tcp_retries2 (its paths are parameters; nothing else differs from what runs on
the node): set, kept in sysctl.d, the node's own value put back by delete and by a null setting."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ascend_pd.config import DEFAULT_TCP_RETRIES2
from ascend_pd.loader import load_stack
from ascend_pd.plan import build_plan
from ascend_pd.scripts.firewall import firewall, tcp_bound

pytestmark = pytest.mark.integration


class Host:
    def __init__(self, tmp: Path, retries: object = "default", own: str = "15") -> None:
        self.proc = tmp / "proc" / "sys" / "net" / "ipv4" / "tcp_retries2"
        self.state = tmp / "var" / "lib" / "ascend-pd" / "tcp_retries2.before"
        self.sysctl = tmp / "etc" / "sysctl.d" / "90-ascend-pd-tcp.conf"
        self.proc.parent.mkdir(parents=True)
        self.proc.write_text(own + "\n")
        self.set(retries)

    def set(self, retries: object) -> None:
        cfg = load_stack("a2-8node")
        if retries != "default":
            cfg = cfg.model_copy(update={"firewall": cfg.firewall.model_copy(update={"tcp_retries2": retries})})
        plan = build_plan(cfg, "a2-8node")
        self.create, self.delete = tcp_bound(plan, "p0", proc=str(self.proc), state_file=str(self.state),
                                             sysctl_file=str(self.sysctl))

    def run(self, text: str) -> subprocess.CompletedProcess:
        r = subprocess.run(["bash", "-s"], input="set -euo pipefail\nnode=p0\n" + text, capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return r

    @property
    def value(self) -> str:
        return self.proc.read_text().strip()


def test_the_committed_stacks_bound_a_silent_node_and_the_script_carries_it():
    for stack in ("a2-8node", "a3-4node"):
        plan = build_plan(load_stack(stack), stack)
        assert plan.cfg.firewall.tcp_retries2 == DEFAULT_TCP_RETRIES2 == 8
        script = firewall(plan, plan.nodes[0].name)
        assert "tcp_retries2=8\n" in script.create and "tcp_state_file" in script.delete


def test_set_kept_for_a_reboot_and_delete_puts_back_the_nodes_own_value(tmp_path: Path):
    h = Host(tmp_path, own="15")
    r = h.run(h.create)
    assert h.value == "8" and h.state.read_text().strip() == "15"
    assert h.sysctl.read_text() == "net.ipv4.tcp_retries2 = 8\n"
    assert "net.ipv4.tcp_retries2 = 8 on p0" in r.stdout
    h.set(6)  # a changed setting: the update runs the new create; the node's own value stays recorded
    h.run(h.create)
    assert h.value == "6" and h.state.read_text().strip() == "15"
    r = h.run(h.delete)
    assert h.value == "15" and not h.state.exists() and not h.sysctl.exists()
    assert "back to 15" in r.stdout
    h.run(h.delete)  # a second delete (a retried destroy) finds nothing to do
    assert h.value == "15"


def test_null_leaves_the_node_alone_and_puts_back_what_an_earlier_run_changed(tmp_path: Path):
    h = Host(tmp_path, retries=None, own="12")
    h.run(h.create)
    assert h.value == "12" and not h.state.exists() and not h.sysctl.exists()
    h.set(8)
    h.run(h.create)
    assert h.value == "8"
    h.set(None)
    h.run(h.create)
    assert h.value == "12" and not h.state.exists() and not h.sysctl.exists()


@pytest.mark.parametrize("bad", [4, 16, "8", True])
def test_a_value_outside_the_kernels_sane_range_is_refused_by_name(bad: object):
    import json

    from ascend_pd.errors import ConfigError
    from ascend_pd.loader import cli_config_map, load_config

    raw = dict(cli_config_map("a2-8node"))
    firewall_cfg = json.loads(raw.get("firewall", "{}"))
    raw["firewall"] = json.dumps({**firewall_cfg, "tcpRetries2": bad})
    with pytest.raises(ConfigError, match="tcpRetries2"):
        load_config(raw)
