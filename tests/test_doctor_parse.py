"""doctor's pure parts: reading one node's run, the cross-node checks, who pings whom."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import json

from ascend_pd.doctor import Row, cross_checks, parse, peers, ping_targets
from ascend_pd.loader import load_stack
from ascend_pd.plan import build_plan
from ascend_pd.ssh import Result, Target, known_hosts_line, ssh_targets

A2 = build_plan(load_stack("a2-8node"), "a2-8node")


def line(check, status="pass", detail="ok", data=None):
    return json.dumps({"check": check, "status": status, "detail": detail, "fix": "f", "data": data or {}}) + "\n"


def test_parse_rows_errors_and_silence():
    rows = parse(Result("p0", 0, "motd\n" + line("npu") + line("ports", "fail", "taken"), "", 0.4))
    assert rows["npu"].status == "pass" and rows["ports"].detail == "taken" and rows["ssh"].status == "pass"
    assert parse(Result("p0", None, "", "", 5.0, "unreachable over ssh"))["ssh"].detail == "unreachable over ssh"
    assert "printed no result" in parse(Result("p0", 0, "banner\n", "", 0.1))["ssh"].detail
    crashed = parse(Result("p0", 1, line("clock"), "line 3: boom\n", 0.1))
    assert crashed["ssh"].status == "fail" and "exited 1: line 3: boom" in crashed["ssh"].detail


def test_cross_checks_skew_versions_weights():
    now = 1_800_000_000.0
    rows = {}
    for i, n in enumerate(A2.nodes):
        offset = 2000 if n.name == "d3" else (300 if n.name == "d2" else 10 * i)
        files = [["a.safetensors", 10], ["config.json", 5]] + ([["rot.safetensors", 1]] if n.name == "p3" else [])
        rows[n.name] = {
            "clock": Row("pass", "", data={"ms": now * 1000 + offset}),
            "versions": Row("pass", "", data={"driver": "25.5.0", "cann": "8.3.0" if n.name == "p1" else "8.5.0"}),
            "weights": Row("pass", "", data={"digest": "x" if n.name == "p3" else "y", "count": len(files),
                                             "files": files}),
        }
    skew = cross_checks(A2, rows, {n.name: now for n in A2.nodes})
    assert skew == 2000.0
    status = {n: (r["clock-skew"].status, r["same-versions"].status, r["same-weights"].status) for n, r in rows.items()}
    # Offsets 0, 10, ... 50, 300, 2000 ms: median 35; the limit is 500 ms, a warning above 250.
    assert A2.cfg.preflight.max_clock_skew_ms == 500
    assert status["d3"][0] == "fail" and status["d2"][0] == "warn" and status["p0"] == ("pass",) * 3
    assert rows["d3"]["clock-skew"].detail.startswith("clock +1965 ms")
    assert status["p1"][1] == "fail" and "CANN 8.3.0" in rows["p1"]["same-versions"].detail
    assert status["p3"][2] == "fail" and "rot.safetensors extra" in rows["p3"]["same-weights"].detail


def test_who_pings_whom():
    assert peers(A2, "p0") == ["d0", "d1", "d2", "d3"]  # KV goes to every decode node
    assert peers(A2, "d1") == ["p0", "p1", "p2", "p3", "d0", "d2", "d3"]  # and the DP group
    a3 = build_plan(load_stack("a3-4node"), "a3-4node")
    assert peers(a3, "p0") == ["p1", "d0", "d1"]
    rows = {"d0": {"fabric": Row("pass", "", data={"ips": ["10.0.0.1", "", "10.0.0.3"], "vnics": ["10.1.0.1"]})}}
    assert ping_targets(A2, "p0", rows) == [(0, "ping", "10.0.0.1"), (2, "ping", "10.0.0.3"),
                                            (0, "hccs_ping", "10.1.0.1")]


def test_ssh_targets_and_argv():
    t = ssh_targets(A2, identity_file="/k")["d0"]
    assert (t.address, t.user, t.port) == ("192.0.2.20", "root", 22)
    argv = t.argv()
    assert argv[:4] == ["ssh", "-T", "-o", "BatchMode=yes"] and argv[-3:] == ["--", "192.0.2.20", "bash -s"]
    assert "IdentitiesOnly=yes" in argv
    # The committed stack pins every node's host key: doctor checks exactly those (a private known_hosts).
    known = next(a.split("=", 1)[1] for a in argv if a.startswith("UserKnownHostsFile="))
    assert "StrictHostKeyChecking=yes" in argv
    assert Path(known).read_text() == "".join(known_hosts_line(n.address, 22, A2.cfg.ssh.host_keys[n.name])
                                              for n in A2.nodes)
    unpinned = dataclasses.replace(A2, cfg=A2.cfg.model_copy(update={"ssh": A2.cfg.ssh.model_copy(
        update={"host_keys": {}, "insecure_ignore_host_keys": True})}))
    assert not any(a.startswith("UserKnownHostsFile") for a in ssh_targets(unpinned)["d0"].argv())
    pinned = Target("n", "10.0.0.1", "root", 2222, known_hosts_file="/kh").argv()
    assert "UserKnownHostsFile=/kh" in pinned and "StrictHostKeyChecking=yes" in pinned
    assert known_hosts_line("10.0.0.1", 2222, "ssh-ed25519 AAAA ") == "[10.0.0.1]:2222 ssh-ed25519 AAAA\n"
    assert known_hosts_line("10.0.0.1", 22, "ssh-ed25519 AAAA") == "10.0.0.1 ssh-ed25519 AAAA\n"
