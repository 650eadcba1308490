"""The bound on ssh sessions at once (`--parallel`, ascend_pd/ssh.py's gate) and the one deadline of
`logs` and `bundle` across the nodes still waiting for a session. The nodes are local shell
processes standing in for `ssh` (the same stdin script, the same process-group kill): what is under
test is the fan-out, not the network."""

from __future__ import annotations

import time
from dataclasses import dataclass
import pytest

from ascend_pd import ssh

@dataclass(frozen=True)
class LocalTarget(ssh.Target):
    """`bash -s` here instead of `ssh node bash -s`."""

    def argv(self) -> list[str]:
        return ["bash", "-s"]


def targets(n: int) -> dict[str, ssh.Target]:
    return {f"n{i}": LocalTarget(f"n{i}", "127.0.0.1", "root", 22) for i in range(n)}


@pytest.fixture
def gate():
    yield ssh.set_parallel
    ssh.set_parallel(ssh.DEFAULT_PARALLEL)


def test_no_more_sessions_at_once_than_the_gate_lets_through(gate, tmp_path):
    gate(3)
    live = tmp_path / "live"
    live.mkdir()
    # Each run marks itself live, records how many are live, and holds its session a moment.
    script = (f"touch {live}/$$; ls {live} | wc -l >> {tmp_path}/seen; sleep 1; rm {live}/$$; echo done")
    results = ssh.run_on_nodes(targets(10), {f"n{i}": script for i in range(10)}, timeout_s=60)
    assert all(r.ok and r.stdout.strip() == "done" for r in results.values()), results
    seen = [int(x) for x in (tmp_path / "seen").read_text().split()]
    assert len(seen) == 10 and max(seen) <= 3, seen
    assert max(seen) >= 2, seen  # they did run side by side


def test_a_node_whose_turn_comes_after_the_deadline_is_named_and_not_started(gate, tmp_path):
    gate(1)
    started = tmp_path / "started"
    script = f"echo $$ >> {started}; sleep 30"
    t0 = time.monotonic()
    results = ssh.run_on_nodes(targets(3), {f"n{i}": script for i in range(3)}, timeout_s=60, deadline_s=1.5)
    took = time.monotonic() - t0
    assert took < 1.5 + 5, took  # one deadline for all, not one per node in the queue
    errors = sorted(r.error or "" for r in results.values())
    timed_out = [e for e in errors if e.startswith("no answer within")]
    not_started = [e for e in errors if e.startswith("not started:")]
    assert len(timed_out) == 1 and len(not_started) == 2, errors
    assert "(--parallel)" in not_started[0] and "a larger --parallel or --timeout" in not_started[0]
    assert len(started.read_text().split()) == 1  # the two others never ran


def test_without_a_deadline_every_node_waits_its_turn(gate):
    gate(2)
    results = ssh.run_on_nodes(targets(5), {f"n{i}": "sleep 0.2; echo ok" for i in range(5)}, timeout_s=30)
    assert [r.stdout.strip() for r in results.values()] == ["ok"] * 5


@pytest.mark.parametrize("command", ["doctor", "logs", "bundle", "heal"])
def test_parallel_out_of_range_is_refused_by_name(command, capsys):
    from ascend_pd.__main__ import main

    for value in ("0", str(ssh.MAX_PARALLEL + 1), "many"):
        with pytest.raises(SystemExit) as exit_:
            main([command, "--stack", "a2-8node", "--parallel", value])
        assert exit_.value.code == 2, value
        err = capsys.readouterr().err
        assert f"argument --parallel: '{value}'" in err, (value, err)
    assert ssh.parallel() == ssh.DEFAULT_PARALLEL  # nothing was set by a refused value


def test_set_parallel_refuses_a_gate_that_lets_nothing_through():
    with pytest.raises(ValueError, match="--parallel 0"):
        ssh.set_parallel(0)
