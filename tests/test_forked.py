"""ascend_pd.forked: calls run in forked children come back with their results; a call that fails
there in any way is left out, for the caller to run itself; and `diff`'s two captures made that
way are the captures made in process."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from ascend_pd import forked

MAIN = Path(__file__).resolve().parents[1]


def _square(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def _fails() -> None:
    raise RuntimeError("boom")


def _unpicklable():
    return lambda: None


def _dies() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _large(n: int) -> str:
    return "x" * n


def test_each_call_runs_in_a_child_of_its_own():
    out = forked.run_all({"a": (_square, (3,)), "b": (_square, (4,))})
    assert {k: v[0] for k, v in out.items()} == {"a": 9, "b": 16}
    pids = {v[1] for v in out.values()}
    assert len(pids) == 2 and os.getpid() not in pids


@pytest.mark.parametrize("bad", [_fails, _unpicklable, _dies])
def test_a_call_that_fails_in_its_child_is_left_out_and_the_others_come_back(bad):
    out = forked.run_all({"bad": (bad, ()), "good": (_square, (5,))})
    assert set(out) == {"good"} and out["good"][0] == 25


def test_answers_larger_than_a_pipe_come_back_whole():
    # Both children write more than a pipe holds (64 KiB) before the parent reads the second one.
    n = 3 * 1024 * 1024
    out = forked.run_all({1: (_large, (n,)), 2: (_large, (n + 1,))})
    assert len(out[1]) == n and len(out[2]) == n + 1


def test_diff_captures_both_sides_in_children_as_in_process(monkeypatch):
    import importlib

    compare_module = importlib.import_module("ascend_pd.change.compare")  # the package exports a function of that name
    from ascend_pd.change.sources import working_tree

    base = dict(working_tree("a3-4node", MAIN).config)
    decode = json.loads(base["ascend-pd:decode"])
    decode.setdefault("flags", {})["max-num-seqs"] = 9
    new = {**base, "ascend-pd:decode": json.dumps(decode)}
    monkeypatch.setattr(compare_module, "_GRAPHS", {})
    calls = []
    run_all = forked.run_all
    monkeypatch.setattr(forked, "run_all", lambda c: calls.append(len(c)) or run_all(c))
    in_children = compare_module.graphs_of("a3-4node", [(base, None), (new, None)])
    monkeypatch.setattr(compare_module, "_GRAPHS", {})
    in_process = [compare_module.graph_of("a3-4node", base), compare_module.graph_of("a3-4node", new)]
    assert calls == [2]  # forked once, for both sides; graph_of of one side alone runs here
    for forked_graph, own in zip(in_children, in_process):
        assert [r.urn for r in forked_graph.regs] and {r.urn: r for r in forked_graph.regs} == {r.urn: r for r in own.regs}
    assert in_children[0].regs != in_children[1].regs
