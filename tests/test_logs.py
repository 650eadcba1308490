"""`logs` and `bundle` against real sshd fake nodes (tests/preflight_nodes.py) of the a2 layout (8 nodes,
40 ranks), with a fake rank (tests/fakes/fake_vllm.py) that fails at start writing its log where the
launch script puts it; and the pure parts (selection, the pointer commands, --since) without sshd."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml

from ascend_pd import bundle, logs, logsources
from ascend_pd.__main__ import main
from ascend_pd.loader import cli_config_map, load_config, load_stack
from ascend_pd.plan import build_plan

ROOT = Path(__file__).resolve().parent.parent
STACK = "a2-8node"
STATE = "/mnt/state"  # on each fake node: <its directory>/state (bound over /mnt in its mount namespace)
HUNG_DEADLINE_S = 15  # bundle's deadline while a node hangs
SECRET = "zq-planted-7f3a9c1e5b2d"  # recognisable only by its variable's name (HF_TOKEN), no pattern
FAILED = "prefill-1-r0"
ERROR_LINE = "RuntimeError: fake engine core failed at start (FAKE_VLLM_EXIT_AT_START=3)"


# ---------------------------------------------------------------------------------------------
# Pure parts


def _plan():
    return build_plan(load_config(cli_config_map(STACK)), STACK)


def test_selectors_match_the_plans_names():
    plan = _plan()
    every = logsources.sources(plan)
    assert len([s for s in every if s.kind == "rank"]) == 40
    assert [s.name for s in logsources.select(plan, ranks=["prefill-1-r0"])] == ["prefill-1-r0"]
    assert {s.name for s in logsources.select(plan, instances=["prefill-2"])} == {"prefill-2-r0", "prefill-2-r1"}
    assert {s.node for s in logsources.select(plan, roles=["decode"])} == {"d0", "d1", "d2", "d3"}
    on_p0 = logsources.select(plan, nodes=["p0"])
    assert {s.name for s in on_p0} == {"prefill-0-r0", "prefill-0-r1", "worker", "worker-start", "etcd", "proxy"}
    assert [s.node for s in logsources.select(plan, services=["worker"], nodes=["d1"])] == ["d1", "d1"]
    assert logsources.select(plan, services=["etcd"])[0].path == f"{plan.log_dir}/etcd.log"
    with pytest.raises(logsources.SelectionError, match=r"--instance prefill-9: not in this stack .*prefill-0"):
        logsources.select(plan, instances=["prefill-9"])


def test_etcd_in_its_own_container_is_read_with_docker_logs():
    cfg = cli_config_map(STACK)
    cfg["etcd"] = json.dumps({**json.loads(cfg["etcd"]), "image": "quay.io/coreos/etcd:v3.5.17"})
    plan = build_plan(load_config(cfg), STACK)
    etcd = logsources.select(plan, services=["etcd"])[0]
    assert etcd.docker and etcd.path == plan.etcd.container_name
    script = logs.node_script(plan, [(0, etcd)], tail=7)
    assert f"docker logs --tail 7 {plan.etcd.container_name}" in script and "docker exec" not in script


def test_the_pointer_command_is_the_one_that_runs():
    line = logsources.logs_command("a2-8node", rank="prefill-1-r0")
    assert line == "ascend-pd logs --stack a2-8node --rank prefill-1-r0"
    argv = line.split()[1:]
    assert argv[0] == "logs"  # the CLI parses it (selection errors exit 2; a valid one reaches SSH)
    assert main(argv[:3] + ["--rank", "prefill-9-r0"]) == 2


def test_since_keeps_lines_by_their_own_time_and_tracebacks_with_them():
    now = datetime.now().astimezone().replace(microsecond=0)
    old, new = now - timedelta(hours=2), now - timedelta(minutes=1)
    lines = [f"INFO {old:%m-%d %H:%M:%S} [api_server.py:1] started",
             f"ERROR {new:%m-%d %H:%M:%S} [core.py:9] engine died",
             "Traceback (most recent call last):",
             f"I{new:%m%d %H:%M:%S}.123456 worker.cpp:10] glog line",
             f'{{"level":"info","ts":"{old.astimezone().isoformat()}","msg":"etcd old"}}']
    kept = logs.since_filter(lines, logs.parse_since("10m", now), now)
    assert kept == lines[1:4]
    with pytest.raises(ValueError, match="--since yesterday: not a duration"):
        logs.parse_since("yesterday")


def test_redactor_blanks_named_secrets_everywhere():
    r = bundle.Redactor({SECRET})
    text = (f'"Env": ["HF_TOKEN={SECRET}", "MY_API_KEY=abc123456789", "PATH=/usr/bin"]\nlog: using {SECRET}\n'
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----\n"
            "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9\ncfg: secure: AAABAKxyz==\n")
    out = r(text)
    for secret in (SECRET, "abc123456789", "b3BlbnNzaC1rZXk", "eyJhbGciOiJIUzI1NiJ9", "AAABAKxyz=="):
        assert secret not in out
    assert "PATH=/usr/bin" in out and r.count == 1


def test_redactor_blanks_credentials_in_urls_and_secret_flags(monkeypatch):
    monkeypatch.setenv("ASCEND_PD_PROXY_API_KEY", "proxy-key-0123456789")
    r = bundle.Redactor.of(_plan())
    text = ("Env: https_proxy=http://ops:pr0xy-Pass@proxy.example:3128\n"
            "pip: Looking in indexes: https://deploy:idx-pw-987@mirror.example/simple\n"
            "ps: vllm serve /m --api-key sk-live-abcdef123 --hf-token=hf_zzzzzzzz --port 7100\n"
            "curl -H 'Authorization: Bearer proxy-key-0123456789' http://10.0.0.1:8088/healthcheck\n")
    out = r(text)
    for secret in ("pr0xy-Pass", "idx-pw-987", "sk-live-abcdef123", "hf_zzzzzzzz", "proxy-key-0123456789"):
        assert secret not in out, (secret, out)
    # What says where stays: hosts, flag names, ports.
    assert "@proxy.example:3128" in out and "@mirror.example/simple" in out
    assert "--api-key [redacted] --hf-token=[redacted] --port 7100" in out


# ---------------------------------------------------------------------------------------------
# Real sshd nodes

try:
    from preflight_nodes import FakeCluster, SilentListener, usable
except ImportError:  # run from the repository root
    sys.path.insert(0, str(Path(__file__).parent))
    from preflight_nodes import FakeCluster, SilentListener, usable

needs_nodes = pytest.mark.skipif(usable() is not None, reason=str(usable()))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = FakeCluster(STACK, tmp_path_factory.mktemp("logs-nodes"), first=61)
    stack_file = c.project / f"Pulumi.{STACK}.yaml"
    doc = yaml.safe_load(stack_file.read_text())
    doc["config"]["ascend-pd:stateDir"] = STATE
    doc["config"]["ascend-pd:prefill"]["env"] = {"HF_TOKEN": SECRET}
    stack_file.write_text(yaml.safe_dump(doc))
    c.plan = build_plan(load_stack(STACK, c.project), STACK)
    c.stack_file = stack_file
    c.extra_setup = "mount --bind {fake} /mnt\n"
    # The failing rank, started as the launch starts it: its argv and env, stdout and stderr into its log.
    rank = next(r for r in c.plan.ranks if r.name == FAILED)
    log = c.nodes[rank.node].fake / "state" / "logs" / f"{rank.name}.log"
    log.parent.mkdir(parents=True)
    env = {**os.environ, **dict(rank.env), "FAKE_VLLM_EXIT_AT_START": "3",
           "PATH": f"{ROOT / 'tests' / 'fakes' / 'bin'}:{os.environ['PATH']}"}
    with open(log, "w") as f:
        f.write(f"starting with HF_TOKEN={SECRET}\n")  # a rank that echoes its environment
        f.flush()
        rc = subprocess.run(list(rank.argv), env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    assert rc == 3
    for node in c.nodes.values():  # every other rank and service wrote a line
        logs_dir = node.fake / "state" / "logs"
        logs_dir.mkdir(parents=True, exist_ok=True)
        for s in logsources.sources(c.plan):
            if s.node == node.name and s.path.startswith(f"{STATE}/logs/") and s.name != FAILED \
                    and s.name != "prefill-2-r1":  # one rank that never started
                (logs_dir / Path(s.path).name).write_text(f"INFO {s.name} on {node.name} ready\n")
        node.write("inspect.json", f'[{{"Config": {{"Env": ["HF_TOKEN={SECRET}", "PATH=/usr/bin"]}}}}]\n')
    c.start_all()
    yield c
    c.stop_all()


def _cli(cluster, *args: str) -> list[str]:
    return ["--stack-file", str(cluster.stack_file), "--identity", str(cluster.key), *args]


@needs_nodes
def test_logs_rank_shows_the_start_failure_and_a_rank_without_log_says_so(cluster, capsys):
    assert main(["logs", *_cli(cluster, "--rank", FAILED, "--rank", "prefill-2-r1", "--tail", "50")]) == 0
    out = capsys.readouterr().out
    mine = [ln for ln in out.splitlines() if ln.startswith(f"{FAILED}@p1 ")]
    assert any(ln.endswith(ERROR_LINE) for ln in mine), out
    assert "prefill-2-r1@p2 | -- no log yet" in out
    assert "\x1b[" not in out  # piped: plain


@needs_nodes
def test_logs_everything_across_eight_nodes_with_a_node_hung_at_the_banner(cluster, capsys):
    victim = "d2"
    cluster.stop(victim)
    hung = SilentListener(cluster.nodes[victim].address)
    try:
        t0 = time.monotonic()
        # The deadline is generous for a loaded 2-core machine: the hung node ends at the connect timeout.
        rc = main(["logs", *_cli(cluster, "--tail", "50", "--timeout", "15", "--connect-timeout", "2")])
        took = time.monotonic() - t0
    finally:
        hung.close()
        cluster.start(victim)
        cluster.wait_ready([victim])
    cap = capsys.readouterr()
    assert rc == 1 and took < 15 + 3, took
    assert [ln for ln in cap.err.splitlines() if ln.startswith(f"{victim}:")] == [cap.err.strip()]
    assert "not shown: decode-0-r16" in cap.err
    shown = {ln.split(" ", 1)[0] for ln in cap.out.splitlines()}
    assert "proxy@p0" in shown and "worker@d3" in shown and "decode-0-r31@d3" in shown
    assert not any(s.endswith(f"@{victim}") for s in shown)
    assert "prefill-0-r0@p0 | INFO prefill-0-r0 on p0 ready" in cap.out


@needs_nodes
def test_grep_selects_lines_on_the_node(cluster, capsys):
    assert main(["logs", *_cli(cluster, "--role", "prefill", "--grep", "RuntimeError|Traceback")]) == 0
    out = capsys.readouterr().out
    assert f"{FAILED}@p1 | {ERROR_LINE}" in out and f"{FAILED}@p1 | Traceback (most recent call last):" in out
    assert "ready" not in out


@pytest.fixture
def reachable(cluster):
    """A listener on every node's worker port: the nodes count as reachable for status (else it folds
    everything of a node where nothing answers into one line, and one `--node` command)."""
    listeners = [SilentListener(w.address.rsplit(":", 1)[0], int(w.address.rsplit(":", 1)[1]))
                 for w in cluster.plan.workers]
    yield
    for x in listeners:
        x.close()


@needs_nodes
def test_status_points_at_the_failed_rank_and_its_command_shows_the_error(cluster, reachable, capsys):
    from ascend_pd.status import Timeouts, collect_status

    rep = collect_status(cluster.plan, timeouts=Timeouts(connect_s=0.5, request_s=1.0), smoke=False)
    lines = logsources.pointer_lines(cluster.plan, rep)
    pointer = next(ln for ln in lines if ln.startswith("prefill-1 "))
    command = pointer.split(": ", 1)[1]
    assert command == f"ascend-pd logs --stack {STACK} --instance prefill-1"
    argv = command.split()[1:]
    assert main([argv[0], *_cli(cluster, *argv[3:])]) == 0
    assert f"{FAILED}@p1 | {ERROR_LINE}" in capsys.readouterr().out


@needs_nodes
def test_follow_shows_a_new_line_and_exits_cleanly_on_sigint(cluster):
    log = cluster.nodes["p1"].fake / "state" / "logs" / "prefill-1-r1.log"
    proc = subprocess.Popen([sys.executable, "-m", "ascend_pd", "logs", "-f", *_cli(cluster, "--instance", "prefill-1",
                             "--tail", "5")], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_sigint_default)
    try:
        _wait_for(proc, ERROR_LINE, 20)
        with open(log, "a") as f:
            f.write("INFO a line written after logs -f started\n")
        seen = _wait_for(proc, "a line written after logs -f started", 10)
        assert "prefill-1-r1@p1 | INFO a line written after logs -f started" in seen
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        rc = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0 and time.monotonic() - t0 < 5
    assert "Traceback" not in proc.stderr.read()
    deadline = time.monotonic() + 5  # the followers on the node end with the connection
    while _followers(log) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _followers(log) == []


def _sigint_default() -> None:
    # A background job of a non-interactive shell (nsrun.sh) starts with SIGINT ignored, and Python
    # installs its KeyboardInterrupt handler only where SIGINT is not ignored: as from a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for(proc, text: str, seconds: float) -> str:
    """stdout of `proc` until `text` shows (a thread reads it: select on a buffered pipe misses lines)."""
    import threading

    if not hasattr(proc, "lines"):
        proc.lines = []
        threading.Thread(target=lambda: proc.lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    deadline = time.monotonic() + seconds
    while not any(text in ln for ln in proc.lines) and time.monotonic() < deadline:
        time.sleep(0.1)
    got = "".join(proc.lines)
    assert text in got, got
    return got


def _followers(log: Path) -> list[int]:
    """Processes (in this PID namespace: the fake nodes' too) whose command line names the log."""
    remote = f"{STATE}/logs/{log.name}"
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if remote in cmd and "tail" in cmd:
                out.append(int(d.name))
    return out


@needs_nodes
def test_follow_names_a_hung_node_and_follows_the_rest(cluster):
    victim = "p3"
    cluster.stop(victim)
    hung = SilentListener(cluster.nodes[victim].address)
    proc = subprocess.Popen([sys.executable, "-m", "ascend_pd", "logs", "-f", *_cli(cluster, "--role", "prefill",
                             "--tail", "1", "--timeout", "4", "--connect-timeout", "2")], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    try:
        _wait_for(proc, "prefill-0-r0@p0 | INFO", 15)
        time.sleep(5)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=10)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        hung.close()
        cluster.start(victim)
        cluster.wait_ready([victim])
    assert rc == 1
    assert [ln for ln in err.splitlines() if ln.startswith(f"{victim}: ")] == [err.strip()], err
    assert "not followed: prefill-3-r0, prefill-3-r1" in err


@needs_nodes
def test_bundle_with_a_hung_node_holds_the_error_and_no_secret(cluster, tmp_path):
    victim = "d1"
    cluster.stop(victim)
    hung = SilentListener(cluster.nodes[victim].address)
    out = tmp_path / "b.tar.gz"
    try:
        t0 = time.monotonic()
        # The deadline is what the hung node costs; 8 s let a live node's collection time out too under
        # CI's load (its "no such log" line then gave way to a timeout line).
        res = bundle.make_bundle(cluster.plan, cluster.targets(connect_timeout_s=2), out, lines=100,
                                 timeout_s=HUNG_DEADLINE_S, stack_file=cluster.stack_file,
                                 identity_file=str(cluster.key))
        took = time.monotonic() - t0
    finally:
        hung.close()
        cluster.start(victim)
        cluster.wait_ready([victim])
    assert took < HUNG_DEADLINE_S + 6, took
    with tarfile.open(out) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode() for m in tar.getmembers()}
    assert ERROR_LINE in files[f"nodes/p1/logs/{FAILED}.log"]
    manifest = files["MANIFEST"]
    assert f"nodes/{victim}: unreachable over ssh root@{cluster.nodes[victim].address}" in manifest
    failed_nodes = [m for m in res.missing if m.startswith("nodes/") and "/" not in m.split(":")[0][len("nodes/"):]]
    assert [m.split(":")[0] for m in failed_nodes] == [f"nodes/{victim}"], failed_nodes  # every live node collected
    assert f"nodes/p2/logs/prefill-2-r1.log: no such log" in manifest
    assert f"etcd.json: RuntimeError: etcd at {cluster.plan.etcd.client_url} did not answer" in manifest  # none here
    for name in ("plan/summary.txt", "plan/stack.yaml", "plan/config.json", "status.json", "doctor.json",
                 "versions.txt", "nodes/p0/container-inspect.txt", "nodes/p0/npu-smi.txt", "nodes/p0/memory.txt",
                 "nodes/p0/container-processes.txt", "nodes/p0/logs/proxy.log"):
        assert name in files and name in manifest, name
    assert not any(k.startswith(f"nodes/{victim}/") for k in files)
    leaks = [k for k, text in files.items() if SECRET in text]
    assert leaks == []
    assert "HF_TOKEN=[redacted]" in files["nodes/p0/container-inspect.txt"]
    assert "HF_TOKEN=[redacted]" in files[f"nodes/p1/logs/{FAILED}.log"]
    key = cluster.key.read_text().splitlines()[1]
    assert not any(key in text for text in files.values())


def test_heal_names_the_logs_command_of_a_crash_loop_and_of_every_broken_instance():
    from ascend_pd.heal import HealReport, InstanceHeal

    rep = HealReport(stack=STACK, polled_at=0.0, broken=["prefill-1", "decode-0"], workers=["d1: restarted"],
                     instances=[InstanceHeal("prefill-1", ["prefill-1-r0: dead"], "left-out", "3 restarts in 30 min"),
                                InstanceHeal("decode-0", ["decode-0-r3: hung"], "healed")])
    text = rep.text()
    assert f"(its logs: `ascend-pd logs --stack {STACK} --instance prefill-1 --tail 200`)" in text
    assert f"    logs: ascend-pd logs --stack {STACK} --instance decode-0\n" in text
    assert f"worker d1: restarted; logs: ascend-pd logs --stack {STACK} worker --node d1" in text


def test_every_alert_about_the_stack_names_its_logs_command():
    from ascend_pd.monitoring import alerts

    by_name = {a.name: a.runbook for a in alerts(_plan())}
    assert by_name["AscendPdRankDown"].endswith(
        f"Logs: `ascend-pd logs --stack {STACK} --rank {{{{ $labels.rank }}}} --tail 200`.")
    assert f"`ascend-pd logs --stack {STACK} etcd --tail 200`" in by_name["AscendPdEtcdDown"]
    assert all("ascend-pd logs" in rb for name, rb in by_name.items() if name in logsources.ALERT_LOGS)


@pytest.fixture
def agent(cluster, monkeypatch):
    """An ssh-agent holding the cluster's key: what `status -v` uses (it has no --identity)."""
    out = subprocess.run(["ssh-agent", "-s"], capture_output=True, text=True, check=True).stdout
    env = dict(m.split("=", 1) for m in (part.split(";")[0] for part in out.split("\n")) if "=" in m)
    monkeypatch.setenv("SSH_AUTH_SOCK", env["SSH_AUTH_SOCK"])
    subprocess.run(["ssh-add", "-q", str(cluster.key)], check=True, capture_output=True)
    yield
    os.kill(int(env["SSH_AGENT_PID"]), signal.SIGTERM)


@needs_nodes
def test_status_verbose_shows_the_last_lines_of_the_failed_ranks_log(cluster, reachable, agent):
    from ascend_pd.status import Timeouts, run

    buf = io.StringIO()
    t0 = time.monotonic()
    code = run(cluster.plan, verbose=True, smoke=False, timeouts=Timeouts(connect_s=0.5, request_s=4.0), out=buf,
               err=io.StringIO())
    took = time.monotonic() - t0
    text = buf.getvalue()
    assert code == 1
    assert f"  prefill-1 (down, 2 ranks): ascend-pd logs --stack {STACK} --instance prefill-1" in text
    tail = text.split("LAST 20 LINES of the broken ranks' logs")[1]
    assert "(8 of 40: `ascend-pd logs` shows the others)" in tail
    assert f"  {FAILED}@p1 ({STATE}/logs/{FAILED}.log):\n" in tail and f"    {ERROR_LINE}\n" in tail
    assert "  prefill-2-r0@p2" in tail
    assert took < 4.0 * 2 + 3, took  # the poll's deadline, then the logs' one


@needs_nodes
def test_status_folds_the_logs_of_unreachable_nodes_into_one_command(cluster):
    from ascend_pd.status import Timeouts, collect_status

    rep = collect_status(cluster.plan, timeouts=Timeouts(connect_s=0.5, request_s=1.0), smoke=False)
    nodes = " ".join(f"--node {n}" for n in cluster.nodes)
    assert logsources.pointer_lines(cluster.plan, rep) == [
        f"everything on {', '.join(cluster.nodes)} (unreachable): ascend-pd logs --stack {STACK} {nodes}"]


@needs_nodes
def test_a_stopped_container_is_named_not_taken_for_missing_logs(cluster, capsys):
    node = cluster.nodes["p2"]
    node.set(container="stopped")
    try:
        assert main(["logs", *_cli(cluster, "--node", "p2", "--node", "p3", "--tail", "3")]) == 0
    finally:
        node.set(container="running")
    out = capsys.readouterr().out
    assert ("prefill-2-r0@p2 | -- container ds_v4_flash_yr is not running (false): its logs are inside it "
            "(docker start ds_v4_flash_yr, or pulumi up)") in out
    assert "prefill-3-r0@p3 | INFO prefill-3-r0 on p3 ready" in out
