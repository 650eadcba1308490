"""The rendered probes (ascend_pd.probes), checked with shellcheck and run for real: liveness.sh
against a real liveness file (and a real openYuanrong worker's), a real etcd and fake vLLM ranks;
readiness.sh against the release's PD proxy in front of fake ranks that speak the P/D protocol (and
small stand-in servers)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ascend_pd.plan import proxy_key_file
from ascend_pd.probes import ProbeSettings, liveness_script, probe_dir, probes, readiness_script
from proxy_key import TEST_PROXY_KEY
from status_support import (
    Procs, Silent, Workers, a2_8node_on_loopback, clean_env, have_dscli, have_etcd, plan_of, small_stack,
    start_etcd, start_proxy, start_ranks, worker_pids,
)

# Addresses of this module (test_status.py uses others): n0 runs prefill, etcd and the proxy; n1 decode.
ADDRS = {"n0": "127.0.2.11", "n1": "127.0.2.12"}
ETCD_PORT = 12579


def stack(tmp: Path, **kw) -> dict:
    kw.setdefault("etcd_port", ETCD_PORT)
    return small_stack(tmp, ADDRS, prefill=["n0"], decode=["n1"], etcd_node="n0", proxy_node="n0", **kw)


def run(path: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", path], capture_output=True, text=True, timeout=timeout, env=clean_env())


def install(plan, node: str, settings: ProbeSettings = ProbeSettings()) -> str:
    script = probes(plan, node, settings=settings)
    done = subprocess.run(["bash", "-s"], input=script.create, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return probe_dir(plan)


def one_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout + done.stderr
    return lines[0]


# ---------------------------------------------------------------------------------------------
# Rendering (no processes)


def test_script_shape(tmp_path):
    plan = plan_of(stack(tmp_path))
    s0, s1 = probes(plan, "n0"), probes(plan, "n1")
    assert (s0.name, s0.node, s0.where) == ("probes", "n0", "container")
    assert "readiness.sh" in s0.create and "readiness.sh" not in s1.create.split("rm -f")[0]
    live = liveness_script(plan, "n0")
    # etcd is probed at the plan's port (the seed's probe used 12379 against etcd on 2379)
    assert f"{plan.etcd.client_url}/health" in live
    assert f"http://{ADDRS['n1']}" not in live  # only this node's ranks
    for r in plan.ranks_of("prefill"):
        assert f"http://{r.address}:{r.port}/health" in live
    assert "etcd" not in liveness_script(plan, "n1").split("set -euo pipefail", 1)[1].replace("etcd_", "")
    ready = readiness_script(plan)
    assert f"proxy={plan.proxy.url}\n" in ready and "model=tiny-test-model\n" in ready
    # The ranks whose /metrics prove the P/D path: the proxy's backends, in its order.
    assert f"ranks='{plan.proxy.backends_json}'\n" in ready
    assert f"readiness_timeout_s={ProbeSettings().readiness_timeout_s}\n" in ready  # the whole check's bound
    for text in (live, ready):
        assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    assert "--connect-timeout" in live and " -m " in live  # every call bounded
    with pytest.raises(ValueError, match="unknown node"):
        probes(plan, "nope")
    with pytest.raises(ValueError):
        ProbeSettings(log_keep=0)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shellcheck(tmp_path):
    plans = [plan_of(stack(tmp_path)), plan_of(a2_8node_on_loopback(tmp_path), "a2-8node")]
    n = 0
    for plan in plans:
        for node in plan.nodes:
            s = probes(plan, node.name)
            texts = {"create": s.create, "delete": s.delete, "liveness": liveness_script(plan, node.name)}
            if node.name == plan.proxy.node:
                texts["readiness"] = readiness_script(plan)
            for kind, text in texts.items():
                f = tmp_path / f"{plan.stack}-{node.name}-{kind}.sh"
                f.write_text(text)
                n += 1
    done = subprocess.run(["shellcheck", "-s", "bash", *map(str, sorted(tmp_path.glob("*.sh")))],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
    assert n >= 30


def test_install_idempotent_and_delete(tmp_path):
    plan = plan_of(stack(tmp_path))
    d = Path(install(plan, "n0"))
    assert sorted(p.name for p in d.iterdir()) == ["liveness.sh", "readiness.sh"]
    assert all(os.access(d / n, os.X_OK) for n in ("liveness.sh", "readiness.sh"))
    assert (d / "liveness.sh").read_text() == liveness_script(plan, "n0")
    install(plan, "n0")  # a second run changes nothing
    assert sorted(p.name for p in d.iterdir()) == ["liveness.sh", "readiness.sh"]
    done = subprocess.run(["bash", "-s"], input=probes(plan, "n0").delete, capture_output=True, text=True)
    assert done.returncode == 0 and not d.exists()
    done = subprocess.run(["bash", "-s"], input=probes(plan, "n0").delete, capture_output=True, text=True)
    assert done.returncode == 0  # deleting twice is fine


def test_liveness_file_only(tmp_path):
    """A node that runs only the worker: fresh, missing, stale and wrong liveness files."""
    plan = plan_of(small_stack(tmp_path, {**ADDRS, "n2": "127.0.2.13"}, prefill=["n0"], decode=["n1"],
                               etcd_node="n0", proxy_node="n0", etcd_port=ETCD_PORT))
    d = install(plan, "n2", ProbeSettings(liveness_max_age_s=10))
    live = tmp_path / "liveness"
    done = run(f"{d}/liveness.sh")
    assert done.returncode == 1
    assert one_line(done) == f"liveness n2: FAIL (openYuanrong worker 127.0.2.13:18481: liveness file {live} is missing)"
    live.write_text("liveness check success\n")
    done = run(f"{d}/liveness.sh")
    assert done.returncode == 0
    assert one_line(done) == "liveness n2: OK (openYuanrong worker alive (liveness 0s old))"
    old = time.time() - 60
    os.utime(live, (old, old))
    done = run(f"{d}/liveness.sh")
    assert done.returncode == 1 and "not rewritten for 6" in one_line(done) and "limit 10s" in done.stdout
    live.write_text("liveness check failed: rocksdb\n")
    done = run(f"{d}/liveness.sh")
    assert done.returncode == 1 and "says 'liveness check failed: rocksdb'" in one_line(done)
    log = (Path(d) / "liveness.log").read_text().splitlines()
    assert len(log) == 4 and all(" liveness n2: " in line for line in log)


# ---------------------------------------------------------------------------------------------
# Against real processes


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not have_etcd():
        pytest.skip("Debian etcd not installed")
    tmp = tmp_path_factory.mktemp("probes")
    plan = plan_of(stack(tmp))
    procs = Procs(tmp / "logs")
    try:
        start_etcd(plan, procs)
        start_ranks(plan, procs)
        start_proxy(plan, procs)
        yield tmp, plan, procs
    finally:
        procs.stop_all()


@pytest.mark.integration
def test_liveness_all_alive_then_rank_killed(cluster):
    tmp, plan, procs = cluster
    (tmp / "liveness").write_text("liveness check success")
    # Both nodes share one state dir on this machine (one container each in real life): n1 first.
    d1 = install(plan, "n1")
    done = run(f"{d1}/liveness.sh")
    assert done.returncode == 0 and "etcd" not in one_line(done) and "2/2 ranks healthy" in done.stdout
    d = install(plan, "n0")
    t0 = time.monotonic()
    done = run(f"{d}/liveness.sh")
    line = one_line(done)
    assert done.returncode == 0, line
    assert line.startswith("liveness n0: OK (") and f"etcd {plan.etcd.endpoint} healthy" in line
    assert "2/2 ranks healthy" in line
    assert time.monotonic() - t0 < 5

    victim = plan.ranks_of("prefill")[1]
    procs.stop(f"rank-{victim.name}")
    try:
        done = run(f"{d}/liveness.sh")
        line = one_line(done)
        assert done.returncode == 1
        assert line.startswith("liveness n0: FAIL (")
        assert f"rank {victim.name} http://{victim.address}:{victim.port}/health: cannot connect" in line
        assert plan.ranks_of("prefill")[0].name not in line  # the live rank is not blamed
        log = (Path(d) / "liveness.log").read_text().splitlines()
        assert log[-1].endswith(line) and "liveness n0: OK (" in log[-2]
    finally:
        start_ranks(plan, procs, [victim])


@pytest.mark.integration
def test_liveness_etcd_at_the_plans_port(cluster, tmp_path):
    tmp, plan, procs = cluster
    (tmp / "liveness").write_text("liveness check success")
    # Same cluster, but the plan says etcd listens on a port where nothing does: the probe must fail.
    values = stack(tmp, etcd_port=ETCD_PORT + 10)
    values["stateDir"] = str(tmp_path / "state")
    wrong = plan_of(values)
    d = install(wrong, "n0")
    done = run(f"{d}/liveness.sh")
    assert done.returncode == 1
    assert f"etcd http://{ADDRS['n0']}:{ETCD_PORT + 10}/health" in one_line(done)
    assert "2/2 ranks healthy" not in done.stdout  # FAIL lines list failures only


@pytest.mark.integration
def test_liveness_log_rotation(cluster, tmp_path):
    tmp, plan, _ = cluster
    (tmp / "liveness").write_text("liveness check success")
    values = stack(tmp)
    values["stateDir"] = str(tmp_path / "state")
    p = plan_of(values)
    d = Path(install(p, "n1", ProbeSettings(log_max_bytes=300, log_keep=2)))
    for _ in range(12):
        assert run(f"{d}/liveness.sh").returncode == 0
    logs = sorted(x.name for x in d.glob("liveness.log*"))
    assert logs == ["liveness.log", "liveness.log.1", "liveness.log.2"]
    for name in logs:
        size = (d / name).stat().st_size
        assert size < 300 + 200, (name, size)  # rotated once past the bound (one line over at most)


@pytest.mark.integration
def test_readiness_proves_the_pd_path(cluster):
    tmp, plan, procs = cluster
    d = install(plan, "n0")
    done = run(f"{d}/readiness.sh")
    line = one_line(done)
    assert done.returncode == 0, line
    p, dec = plan.ranks_of("prefill"), plan.ranks_of("decode")
    assert re.fullmatch(
        rf"readiness n0: OK \(smoke completion ok via {re.escape(plan.proxy.url)}: "
        rf"prefill http://{p[0].address}:({p[0].port}|{p[1].port}) and decode http://{dec[0].address}:"
        rf"({dec[0].port}|{dec[1].port}) in [0-9.]+s: '\S[^']*'\)", line), line
    assert (Path(d) / "readiness.log").read_text().strip().endswith(line)


@pytest.mark.integration
def test_readiness_reports_a_broken_decode_side(cluster):
    """Every decode fails its KV load: the release proxy answers 200 with an empty body, which is not ready."""
    tmp, plan, procs = cluster
    d = install(plan, "n0")
    decode = plan.ranks_of("decode")
    for r in decode:
        procs.stop(f"rank-{r.name}")
    start_ranks(plan, procs, decode, FAKE_VLLM_FAULT="transfer-fail")
    try:
        done = run(f"{d}/readiness.sh")
    finally:
        for r in decode:
            procs.stop(f"rank-{r.name}")
        start_ranks(plan, procs, decode)
    line = one_line(done)
    assert done.returncode == 1
    assert re.search(r"readiness n0: FAIL \(smoke completion failed via \S+: HTTP 200 with an empty body: the "
                     r"decode side failed \(decode rank http://127\.0\.2\.12:\d+ failed the request\)\)", line), line


def test_readiness_bounded_when_proxy_hangs_or_is_gone(tmp_path):
    plan = plan_of(stack(tmp_path, proxy_port=18932))
    d = install(plan, "n0", ProbeSettings(readiness_timeout_s=2, connect_timeout_s=1))
    done = run(f"{d}/readiness.sh")  # no proxy deployed yet: not even its key
    assert done.returncode == 1 and "cannot read the proxy's key" in one_line(done)
    key = Path(proxy_key_file(plan.cfg))  # what <node>-proxy-key writes
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text(TEST_PROXY_KEY)
    done = run(f"{d}/readiness.sh")  # nothing listening
    assert done.returncode == 1 and one_line(done).startswith(f"readiness n0: FAIL (smoke completion failed via {plan.proxy.url}:")
    silent = Silent(ADDRS["n0"], 18932)
    try:
        t0 = time.monotonic()
        done = run(f"{d}/readiness.sh")
        took = time.monotonic() - t0
    finally:
        silent.close()
    assert done.returncode == 1 and "no answer within 2s" in one_line(done)
    assert took < 5, took


@pytest.mark.integration
@pytest.mark.skipif(not (have_etcd() and have_dscli()), reason="needs etcd and openYuanrong's dscli")
def test_liveness_with_a_real_worker(cluster, tmp_path):
    """The real worker writes the liveness file; a hung worker (SIGSTOP) leaves it stale, and a stopped
    one leaves it stale or (a graceful `dscli stop`) removes it: either way the probe fails."""
    tmp, plan, procs = cluster
    workers = Workers(tmp_path)
    values = stack(tmp)
    values["stateDir"] = str(tmp_path / "state")
    values["yuanrong"]["livenessPath"] = str(workers.liveness("n1"))
    p = plan_of(values)
    try:
        workers.start_many(p, ["n1"])
        d = install(p, "n1", ProbeSettings(liveness_max_age_s=2))
        done = run(f"{d}/liveness.sh")
        assert done.returncode == 0, done.stdout
        assert re.search(r"openYuanrong worker alive \(liveness [01]s old\)", one_line(done))
        address = p.worker("n1").address
        pids = worker_pids(address)
        assert pids
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(3.5)
            done = run(f"{d}/liveness.sh")
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        assert done.returncode == 1 and "not rewritten for" in one_line(done), done.stdout
        workers.stop(address)
        time.sleep(3.5)
        done = run(f"{d}/liveness.sh")
        assert done.returncode == 1 and ("not rewritten for" in one_line(done) or "is missing" in one_line(done)), done.stdout
    finally:
        workers.stop_all()
