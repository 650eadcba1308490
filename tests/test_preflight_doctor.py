"""doctor and the pulumi-up gate against the a2-8node stack's 8 nodes as fake Ascend nodes, each
behind a real sshd on its own loopback address (tests/preflight_nodes.py), over the real OpenSSH
client and ascend_pd.ssh.

The faults are injected through the fake tools' scenario files and the nodes' own files. One run
injects one fault per node, each in a different check, so a run proves both that the fault is
caught (node, check, and a fix named) and that it fails nothing else: every other (node, check)
passes. Run as root in a private namespace (see the README's test section).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from preflight_nodes import MODEL_PATH, FakeCluster, SilentListener, meminfo, npu_ip, usable, vnic_ip

from ascend_pd.doctor import Report, run_doctor, table
from ascend_pd.plan import build_plan
from ascend_pd.scripts.preflight import preflight
from ascend_pd.shell import on_host
from ascend_pd.ssh import run_one

pytestmark = pytest.mark.skipif(usable() is not None, reason=usable() or "")

ROOT = Path(__file__).resolve().parent.parent
# Generous: the machine these run on is shared and loaded; the measured times are in the README.
RUN_BOUND_S = 90
CONTAINER = "ds_v4_flash_yr"  # the a2-8node stack's container.name


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = FakeCluster("a2-8node", tmp_path_factory.mktemp("preflight"))
    c.start_all()
    yield c
    c.stop_all()


@pytest.fixture()
def nodes(cluster):
    cluster.reset()
    yield cluster
    cluster.reset()


def failures(report: Report) -> dict[tuple[str, str], str]:
    return {(n, c): r.detail for n, checks in report.rows.items() for c, r in checks.items() if r.status == "fail"}


def doctor(cluster: FakeCluster, **kw) -> Report:
    start = time.monotonic()
    report = run_doctor(cluster.plan, cluster.targets(), timeout_s=60, **kw)
    assert time.monotonic() - start < RUN_BOUND_S
    return report


def test_all_pass(nodes):
    report = doctor(nodes)
    assert failures(report) == {}, table(report)
    for name, checks in report.rows.items():
        for check in ("ssh", "clock", "versions", "page-size", "memory", "npu", "hccn-conf", "fabric", "ping",
                      "ports", "weights", "docker", "network", "firewall", "clock-skew", "same-versions",
                      "same-weights"):
            assert check in checks, (name, check)
    assert report.rows["p0"]["firewall"].detail == ("table inet ascend_pd loaded; 3 packet(s) from outside the "
                                                    "cluster dropped")
    # Prefill nodes ping the 4 decode nodes' 8 NPUs; decode nodes the 4 prefill nodes and their 3 DP peers.
    assert report.rows["p0"]["ping"].detail == "32 pings answered"
    assert report.rows["d0"]["ping"].detail == "56 pings answered"
    assert report.skew_ms is not None and report.skew_ms < 5000
    print(f"\nall-pass doctor, 8 nodes: {report.elapsed_s:.1f} s")


def test_node_faults_set_one(nodes):
    n = nodes.nodes
    n["p1"].write("version.info", "Version=24.1.0\n")  # driver below the profile's 25.2.3
    n["p2"].set(page_size=65536)
    n["d1"].write("meminfo", meminfo(1536, 100))  # 500 GiB of huge pages wanted
    n["d3"].set(clock_offset_ms=60000)
    n["p3"].set(npu__health__5="Warning")
    n["d0"].set(npu__proc__2="31337:python3:61000")  # a leftover of an earlier run
    n["p0"].set(listen="7100:nginx:999")
    n["d2"].set(docker="down")
    report = doctor(nodes)
    got = failures(report)
    assert set(got) == {("p1", "versions"), ("p1", "same-versions"), ("p2", "page-size"), ("d1", "memory"),
                        ("d3", "clock-skew"), ("p3", "npu"), ("d0", "npu"), ("p0", "ports"), ("d2", "docker")}, \
        table(report)
    assert "driver 24.1.0 is older than 25.2.3" in got["p1", "versions"]
    assert "65536" in got["p2", "page-size"]
    assert "MemAvailable is 100 GiB" in got["d1", "memory"]
    shift = int(got["d3", "clock-skew"].split()[1])  # "clock +59957 ms from the cluster's median ..."
    assert 55_000 < shift < 65_000
    assert "NPU 5 Warning" in got["p3", "npu"]
    assert "pid 31337 (python3, 61000 MB)" in got["d0", "npu"]
    assert "7100 (prefill-0-r0:prefill.portBase) by nginx pid 999" in got["p0", "ports"]
    assert "docker does not answer" in got["d2", "docker"]
    for (node, check) in got:  # every failure names its fix
        assert report.rows[node][check].fix, (node, check)
    text = table(report)
    assert "FAIL p2 page-size: getconf PAGE_SIZE is 65536" in text and "fix: use the openYuanrong package" in text


def test_node_faults_set_two(nodes):
    n = nodes.nodes
    os.unlink(n["p0"].fake / "hccn.conf")
    stale = npu_ip(5, 4).rsplit(".", 1)[0] + ".99"
    hccn = (n["d1"].fake / "hccn.conf").read_text().replace(f"address_4={npu_ip(5, 4)}", f"address_4={stale}")
    n["d1"].write("hccn.conf", hccn)  # the NPU still has its old address (vllm-ascend #16847)
    n["p1"].set(link__6="DOWN")
    n["p2"].set(unreachable=npu_ip(6, 3))  # p2 NPU 3 cannot reach d2 NPU 3
    n["d3"].write("weights/model/model-00002-of-00003.safetensors", "truncated")
    n["p3"].write("weights/model/rot.safetensors", "rot")
    n["d0"].set(down="https://gitcode.com/")
    n["d2"].write("ascend_toolkit_install.info", "version=8.5.1\n")  # newer than the minimum, but not the same
    n["p2"].set(nft="denied")  # ssh.user is not root: nft cannot load the table
    n["d3"].set(nft_tables="inet:filter")  # the container runs, ascend-pd's table was removed by hand
    os.unlink(n["d1"].fake / "version.info")  # the driver version then comes from npu-smi's header
    report = doctor(nodes)
    got = failures(report)
    assert set(got) == {("p0", "hccn-conf"), ("d1", "fabric"), ("p1", "fabric"), ("p2", "ping"),
                        ("d3", "same-weights"), ("p3", "weights"), ("p3", "same-weights"), ("d0", "network"),
                        ("d2", "same-versions"), ("p2", "firewall")}, table(report)
    assert "nft cannot read the ruleset: Error: cache initialization failed: Operation not permitted" in got["p2", "firewall"]
    assert report.rows["p2"]["firewall"].fix.startswith("log in as root")
    d3 = report.rows["d3"]["firewall"]
    assert d3.status == "warn" and "table inet ascend_pd is not loaded: every port is open" in d3.detail, d3
    assert "/etc/hccn.conf is missing" in got["p0", "hccn-conf"]
    assert f"NPU 4 has IP {npu_ip(5, 4)} but /etc/hccn.conf says address_4={stale}" in got["d1", "fabric"]
    assert "NPU 6 link DOWN" in got["p1", "fabric"]
    assert got["p2", "ping"] == f"NPU 3 -> {npu_ip(6, 3)} (ping) unreachable"
    assert "model-00002-of-00003.safetensors 9 bytes, not 1002" in got["d3", "same-weights"]
    assert "rot.safetensors" in got["p3", "weights"] and "rot.safetensors extra" in got["p3", "same-weights"]
    assert "https://gitcode.com/" in got["d0", "network"]
    assert "CANN 8.5.1 while most nodes have driver 25.5.0, CANN 8.5.0" in got["d2", "same-versions"]
    assert report.rows["d1"]["versions"].detail == "driver 25.5.0, CANN 8.5.0"


def test_a_rerun_accepts_the_stacks_own_processes(nodes):
    d0 = nodes.nodes["d0"]
    # vLLM ranks of this stack hold NPU 2 and port 7100: docker top of the stack's container lists them.
    d0.set(npu__proc__2="4242:python3:61000", listen="7100:python3:4242", **{f"top.{CONTAINER}": "4242 4243"})
    d0.write("meminfo", meminfo(1536, 10, hugepages_total=256000))  # its 500 GiB of huge pages are reserved
    report = doctor(nodes, nodes=["d0"], only=["npu", "ports", "memory"])
    assert failures(report) == {}, table(report)
    assert "1 processes of this stack" in report.rows["d0"]["npu"].detail
    assert "1 held by this stack" in report.rows["d0"]["ports"].detail
    d0.set(**{f"top.{CONTAINER}": "4243"})  # the same pids, no longer ours: a leftover
    assert set(failures(doctor(nodes, nodes=["d0"], only=["npu", "ports"]))) == {("d0", "npu"), ("d0", "ports")}
    # Without hugeTlb the worker's shared memory (500 GiB) comes out of MemAvailable: needed on a first
    # deploy, already taken while the stack's container runs.
    cfg = nodes.plan.cfg
    shm_plan = build_plan(cfg.model_copy(update={"hugepages": None, "yuanrong": cfg.yuanrong.model_copy(
        update={"huge_tlb": False})}), "a2-8node")
    d0.write("meminfo", meminfo(1536, 100))
    rerun = run_doctor(shm_plan, nodes.targets(), nodes=["d0"], only=["memory"], timeout_s=60)
    assert failures(rerun) == {}, table(rerun)
    assert "already holds its shared memory" in rerun.rows["d0"]["memory"].detail
    d0.set(**{f"top.{CONTAINER}": ""})  # no container: a first deploy
    first = failures(run_doctor(shm_plan, nodes.targets(), nodes=["d0"], only=["memory"], timeout_s=60))
    assert "worker shared memory 500 GiB) but MemAvailable is 100 GiB" in first["d0", "memory"]


def test_unreachable_node_is_one_failed_row(nodes):
    nodes.stop("d1")
    hung = SilentListener(nodes.nodes["d1"].address)  # accepts, never speaks SSH
    try:
        start = time.monotonic()
        report = run_doctor(nodes.plan, nodes.targets(connect_timeout_s=5), timeout_s=60)
        elapsed = time.monotonic() - start
    finally:
        hung.close()
        nodes.start("d1")
        nodes.wait_ready(["d1"])
    got = failures(report)
    assert set(got) == {("d1", "ssh")}, table(report)
    assert "unreachable over ssh root@127.0.0.16:2222" in got["d1", "ssh"]
    assert report.rows["d1"].keys() == {"ssh"}
    # d1 is a decode peer of every prefill node: they ping the 3 others only.
    assert report.rows["p0"]["ping"].detail == "24 pings answered"
    assert elapsed < RUN_BOUND_S
    print(f"\ndoctor with one node hung at the SSH banner: {elapsed:.1f} s")


def test_gate_enforce_stops_and_warn_goes_on(nodes):
    p2 = nodes.nodes["p2"]
    p2.set(page_size=65536)
    target = nodes.targets()["p2"]
    text = on_host(preflight(nodes.plan, "p2").create)
    r = run_one(target, text, 60)
    assert r.rc == 1, r
    assert "preflight p2: page-size FAILED: getconf PAGE_SIZE is 65536" in r.stderr
    assert "Fix: use the openYuanrong package built for 64 KB pages" in r.stderr
    assert "stopping before anything is deployed on p2" in r.stderr
    warn_plan = dataclasses.replace(nodes.plan, cfg=nodes.plan.cfg.model_copy(
        update={"preflight": nodes.plan.cfg.preflight.model_copy(update={"mode": "warn"})}))
    r = run_one(target, on_host(preflight(warn_plan, "p2").create), 60)
    assert r.rc == 0, r
    assert "page-size FAILED" in r.stderr and "1 failed" in r.stdout
    p2.set(page_size=4096)
    r = run_one(target, text, 60)
    assert r.rc == 0 and "0 failed" in r.stdout, r


def test_cli_exit_codes_json_and_table(nodes):
    nodes.nodes["p1"].set(page_size=65536)
    base = [sys.executable, "-m", "ascend_pd", "doctor", "--stack", "a2-8node", "--project-dir", str(nodes.project),
            "--identity", str(nodes.key), "--node", "p0", "--node", "p1"]
    ok = subprocess.run(base[:-2] + ["--only", "page-size", "--json"], capture_output=True, text=True, cwd=ROOT,
                        timeout=RUN_BOUND_S)
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["ok"] is True and doc["nodes"]["p0"]["page-size"]["status"] == "pass"
    bad = subprocess.run(base + ["--only", "page-size"], capture_output=True, text=True, cwd=ROOT, timeout=RUN_BOUND_S)
    assert bad.returncode == 1, bad.stderr
    assert "FAIL p1 page-size: getconf PAGE_SIZE is 65536" in bad.stdout and "fix:" in bad.stdout
    wrong = subprocess.run(base + ["--only", "pagesize"], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert wrong.returncode == 2 and "--only pagesize: not a check" in wrong.stderr
    assert MODEL_PATH in nodes.plan.cfg.model.path


def test_a3_checks_vnics_and_hccs_ping(tmp_path_factory):
    """a3-4node: 16 NPU dies per node (8 NPUs x 2 chips in npu-smi), a vNIC per die, and hccs_ping
    to the peers' vNICs beside the RoCE ping."""
    c = FakeCluster("a3-4node", tmp_path_factory.mktemp("preflight-a3"), first=31)
    c.start_all()
    try:
        c.nodes["p1"].set(vnic__9="")
        c.nodes["d0"].set(unreachable=vnic_ip(0, 7))  # d0 die 7 cannot reach p0 die 7 over HCCS
        c.nodes["d1"].write("meminfo", meminfo(768, 700))  # enough for the stack, less than seed 003's 1 T
        # a3's Mooncake side channels (36000+) are inside Linux's default ephemeral range: reserved on
        # every node but p1 (p0 has some reserved already).
        for name, reserved in (("p0", "36100-36107,50000\n"), ("d0", "36000-36299\n"), ("d1", "36216-36231\n")):
            c.nodes[name].write("ip_local_reserved_ports", reserved)
        report = run_doctor(c.plan, c.targets(), timeout_s=60, only=["npu", "fabric", "ping", "memory", "ports"])
        got = failures(report)
        assert set(got) == {("p1", "fabric"), ("d0", "ping")}, table(report)
        warned = {(n, k): r for n, checks in report.rows.items() for k, r in checks.items() if r.status == "warn"}
        assert set(warned) == {("d1", "memory"), ("p0", "ports"), ("p1", "ports")}, table(report)
        assert warned["d1", "memory"].detail == ("MemTotal is 768 GiB, below the 960 GiB the a3 guide assumes "
                                                 "(700 GiB available, 500 GiB more needed)")
        assert warned["p0", "ports"].detail.startswith("ports 36108-36115 are inside the kernel's ephemeral range "
                                                       "32768-60999 and not reserved")
        assert "net.ipv4.ip_local_reserved_ports=36100-36107,50000,36108-36115" in warned["p0", "ports"].fix
        assert warned["p1", "ports"].detail.startswith("ports 36116-36131 are inside")
        assert report.rows["p0"]["memory"].status == "pass"
        assert "NPU 9 has no vNIC address" in got["p1", "fabric"]
        assert got["d0", "ping"] == f"NPU 7 -> {vnic_ip(0, 7)} (hccs_ping) unreachable"
        assert "16 NPU chips healthy" in report.rows["p0"]["npu"].detail
        # p0 (prefill-0 with p1) pings p1 (its DP group), d0 and d1 (decode): 3 x 16 x (ping + hccs_ping),
        # but not p1's die 9, which has no vNIC.
        assert report.rows["p0"]["ping"].detail == "95 pings answered"
    finally:
        c.stop_all()


def test_print_host_keys_prints_what_each_node_presents(nodes):
    # From a copy of the stack without any pinned key (which every other command refuses), the block
    # to pin: every node's ed25519 key with its fingerprint, and known_hosts lines; a silent node is
    # named, exit 1.
    doc = yaml.safe_load((nodes.project / "Pulumi.a2-8node.yaml").read_text())
    del doc["config"]["ascend-pd:ssh"]["hostKeys"]
    unpinned = nodes.tmp / "unpinned"
    unpinned.mkdir(exist_ok=True)
    (unpinned / "Pulumi.yaml").write_text((nodes.project / "Pulumi.yaml").read_text())
    (unpinned / "Pulumi.a2-8node.yaml").write_text(yaml.safe_dump(doc))
    base = [sys.executable, "-m", "ascend_pd", "doctor", "--stack", "a2-8node", "--project-dir", str(unpinned)]
    refused = subprocess.run(base, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert refused.returncode == 2 and "no pinned host key for p0, p1, p2, p3, d0, d1, d2, d3" in refused.stderr
    assert "ascend-pd doctor --stack a2-8node --print-host-keys" in refused.stderr
    pub = " ".join((nodes.tmp / "host_ed25519.pub").read_text().split()[:2])
    fingerprint = subprocess.run(["ssh-keygen", "-lf", str(nodes.tmp / "host_ed25519.pub")], capture_output=True,
                                 text=True).stdout.split()[1]
    r = subprocess.run(base + ["--print-host-keys"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    pinned = yaml.safe_load("\n".join(ln for ln in r.stdout.splitlines() if ln.startswith("  ")))
    assert pinned == {"ascend-pd:ssh": {"hostKeys": {n: pub for n in nodes.nodes}}}
    assert r.stdout.count(f"# {fingerprint}") == len(nodes.nodes)
    assert f"[{nodes.nodes['p0'].address}]:2222 {pub}" in r.stdout.splitlines()
    nodes.stop("d1")
    try:
        r = subprocess.run(base + ["--print-host-keys", "--connect-timeout", "2"], capture_output=True, text=True,
                           cwd=ROOT, timeout=60)
    finally:
        nodes.start("d1")
        nodes.wait_ready(["d1"])
    assert r.returncode == 1 and f"# d1 ({nodes.nodes['d1'].address}):" in r.stdout
