"""Two runs of one container script on one node never overlap (shell.in_container's lock).

The script of a `pulumi up` killed mid-run goes on in the container (a `docker exec`'d process
outlives its client); the next `up` or a `heal` runs the same script there. The exact command Pulumi
sends is run here by `sh -c`, with a stand-in `docker` whose `exec` runs the command on this machine
(and real `flock`, `setsid`, `bash`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ascend_pd import shell
from ascend_pd.loader import load_stack
from ascend_pd.plan import build_plan, restart_bound_s
from ascend_pd.scripts import node_scripts, script_locks

pytestmark = pytest.mark.skipif(shutil.which("flock") is None, reason="flock (util-linux) is not installed")

# `docker inspect` says running; `docker exec -i NAME CMD...` runs CMD here.
STAND_IN_DOCKER = """#!/bin/sh
case "$1" in
  inspect) echo true ;;
  exec) shift; while [ "${1#-}" != "$1" ]; do shift; done; shift; exec "$@" ;;
  *) echo "stand-in docker: unsupported: $*" >&2; exit 2 ;;
esac
"""


@pytest.fixture()
def node(tmp_path: Path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(STAND_IN_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    return {"dir": tmp_path, "env": dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")}


def wrapped(node: dict, body: str, wait_s: int = 30) -> str:
    return shell.in_container("npu", body, lock=shell.Locks(str(node["dir"] / "run"), wait_s).of("launch"))


def start(node: dict, command: str) -> subprocess.Popen:
    return subprocess.Popen(["sh", "-c", command], env=node["env"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_every_container_script_takes_its_own_lock_beside_the_pid_files():
    plan = build_plan(load_stack("a2-8node"), "a2-8node")
    locks = script_locks(plan)
    assert locks.wait_s == restart_bound_s(plan.cfg)  # the longest legitimate run: a whole restart
    paths = {s.name: locks.of(s.name).path for s in node_scripts(plan, "d0") if s.where == "container"}
    assert paths["launch"] == f"{plan.run_dir}/launch.lock" and paths["worker"] == f"{plan.run_dir}/worker.lock"
    assert len(set(paths.values())) == len(paths)  # a node's scripts do not wait for each other


def test_a_second_run_waits_for_the_first_and_starts_after_it_ends(node: dict):
    d = node["dir"]
    # The first run marks its start, then holds on until released (the script of a killed `up`).
    body = (f'echo "start $(date +%s.%N)" >> {d}/runs; [ -e {d}/first ] || {{ touch {d}/first; '
            f'while [ ! -e {d}/release ]; do sleep 0.05; done; }}; echo "end $(date +%s.%N)" >> {d}/runs\n')
    first = start(node, wrapped(node, body))
    wait_for(d / "first")
    second = start(node, wrapped(node, body))
    time.sleep(1.0)
    assert second.poll() is None  # waiting for the lock, not running beside the first
    assert (d / "runs").read_text().count("start") == 1
    (d / "release").touch()
    out2, err2 = second.communicate(timeout=30)
    assert first.wait(timeout=30) == 0 and second.returncode == 0, err2
    assert f"another run of this script holds {d}/run/launch.lock: waiting for it (at most 30 s)" in out2
    events = [line.split() for line in (d / "runs").read_text().splitlines()]
    assert [e[0] for e in events] == ["start", "end", "start", "end"]  # one after the other
    assert float(events[2][1]) >= float(events[1][1])


def test_what_a_run_starts_does_not_hold_its_lock(node: dict):
    """A rank started with `setsid nohup` lives on after the launch: the next launch must not wait for it."""
    d = node["dir"]
    body = f"setsid nohup sleep 300 > /dev/null 2>&1 < /dev/null &\necho $! > {d}/service.pid\n"
    t0 = time.monotonic()
    assert subprocess.run(["sh", "-c", wrapped(node, body)], env=node["env"], timeout=30).returncode == 0
    service = int((d / "service.pid").read_text())
    try:
        assert Path(f"/proc/{service}").exists()
        again = subprocess.run(["sh", "-c", wrapped(node, "echo again\n", wait_s=5)], env=node["env"],
                               capture_output=True, text=True, timeout=30)
        assert again.returncode == 0 and again.stdout.strip() == "again", again.stderr
        assert time.monotonic() - t0 < 4  # neither run waited: the lock went with the first run
    finally:
        os.kill(service, 9)


def test_a_lock_held_past_the_wait_fails_with_what_holds_it(node: dict):
    d = node["dir"]
    (d / "run").mkdir()
    holder = subprocess.Popen(["flock", str(d / "run/launch.lock"), "sleep", "60"])
    try:
        wait_s = 2
        deadline = time.monotonic() + 10
        while subprocess.run(["flock", "-n", str(d / "run/launch.lock"), "true"]).returncode == 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        t0 = time.monotonic()
        r = subprocess.run(["sh", "-c", wrapped(node, f"touch {d}/ran\n", wait_s=wait_s)], env=node["env"],
                           capture_output=True, text=True, timeout=30)
        took = time.monotonic() - t0
    finally:
        holder.kill()
    assert r.returncode == shell.LOCK_TIMEOUT_EXIT
    assert not (d / "ran").exists()  # the script did not run unlocked
    assert wait_s <= took < wait_s + 5
    assert f"another run of this script held {d}/run/launch.lock for {wait_s} s" in r.stderr
    assert f"pgrep -af 'flock.*{d}/run/launch.lock'" in r.stderr


def test_a_container_without_flock_is_refused_by_name(node: dict, tmp_path: Path):
    """No flock in the image: the script does not run unlocked; the error says what to add."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for tool in ("sh", "bash", "mkdir", "touch", "env"):
        (bare / tool).symlink_to(shutil.which(tool))
    (bare / "docker").symlink_to(tmp_path / "bin" / "docker")
    env = dict(node["env"], PATH=str(bare))
    r = subprocess.run([str(bare / "sh"), "-c", wrapped(node, f"touch {tmp_path}/ran\n")], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert "this container has no flock (util-linux)" in r.stderr and "add util-linux to the image" in r.stderr
    assert not (tmp_path / "ran").exists()
