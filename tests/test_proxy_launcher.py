"""The proxy launcher (ascend_pd/shell/pd_proxy_launch.py) against the ProxyState of each release's own
script, fetched by setup.sh: as shipped, a removed instance comes back into selection as soon as one
of its earlier requests ends; through the launcher it stays out until /instances/add, and a role
with no instance in service is refused with 503 instead of being sent to its stopping ranks."""

from __future__ import annotations

import asyncio
import importlib.util
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi import HTTPException

from proxy_release import RELEASES, script_path

LAUNCHER = Path(__file__).resolve().parents[1] / "ascend_pd" / "shell" / "pd_proxy_launch.py"
TOKENS = 10
ROLES = {  # role -> (select, releases of one request, add, taint: what /instances/remove does in flight)
    "prefill": ("select_prefiller", ("release_prefiller", "release_prefiller_kv"), "add_prefillers",
                "_taint_prefillers"),
    "decode": ("select_decoder", ("release_decoder",), "add_decoders", "_taint_decoders"),
}


def launcher():
    spec = importlib.util.spec_from_file_location("pd_proxy_launch", LAUNCHER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def release_namespace(version: str) -> dict:
    path = script_path(version)
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `bash setup.sh`")
    ns = runpy.run_path(str(path), run_name="release_under_test")  # defines app and classes, serves nothing
    # ProxyState starts a NodeListener thread that removes tainted instances once nothing is in
    # flight; these tests keep requests in flight by hand, so it has nothing to do.
    ns["ProxyState"].__init__.__globals__["NodeListener"] = lambda state: None
    return ns


def two_instances(ns: dict):
    return ns["ProxyState"]([("127.0.0.1", 8000), ("127.0.0.1", 8001)], [("127.0.0.1", 9000), ("127.0.0.1", 9001)])


def after_release(ns: dict, role: str) -> tuple[object, list[int]]:
    """Instance 0 serves a request, is removed (tainted, as /instances/remove does while requests
    are in flight), the request ends; then 6 more requests arrive. Which instances they go to."""
    select, releases, _, taint = ROLES[role]
    state = two_instances(ns)
    servers = state.prefillers if role == "prefill" else state.decoders
    state.request_num = 1  # in flight: the taint is what keeps instance 0 out
    assert getattr(state, select)(TOKENS) == 0
    getattr(state, taint)([servers[0]])
    for release in releases:
        getattr(state, release)(0, TOKENS)
    return state, [getattr(state, select)(TOKENS) for _ in range(6)]


@pytest.mark.parametrize("version", sorted(RELEASES))
@pytest.mark.parametrize("role", sorted(ROLES))
def test_as_shipped_a_removed_instance_takes_requests_again(version, role):
    # The release's behaviour the launcher exists for. If this fails, the release fixed it: check
    # whether proxy.keepRemovedOut is still needed.
    _, chosen = after_release(release_namespace(version), role)
    assert 0 in chosen, chosen


@pytest.mark.parametrize("version", sorted(RELEASES))
@pytest.mark.parametrize("role", sorted(ROLES))
def test_through_the_launcher_a_removed_instance_stays_out_until_added(version, role):
    ns = release_namespace(version)
    launcher().keep_taints(ns)
    state, chosen = after_release(ns, role)
    assert chosen == [1] * 6
    select, releases, add, _ = ROLES[role]
    for release in releases:  # its own requests ending does not bring it back either
        getattr(state, release)(1, TOKENS)
    assert getattr(state, select)(TOKENS) == 1
    servers = state.prefillers if role == "prefill" else state.decoders
    getattr(state, add)([servers[0]])  # /instances/add
    assert 0 in [getattr(state, select)(TOKENS) for _ in range(4)]
    heap = state.prefiller_heap if role == "prefill" else state.decoder_heap
    assert all(p < ns["TAINT_PRIORITY"] for p, _, _ in heap)


def test_the_launcher_refuses_a_script_it_cannot_fix(tmp_path):
    toy = tmp_path / "other_proxy.py"
    toy.write_text("import uvicorn\n\nif __name__ == '__main__':\n    uvicorn.run(None)\n")
    r = subprocess.run([sys.executable, str(LAUNCHER), str(toy), "--port", "1"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    assert "has no ProxyState, TAINT_PRIORITY, _handle_completions, proxy_state" in r.stderr and "ascend-pd:proxy.keepRemovedOut to false" in r.stderr, r.stderr


def test_the_launcher_passes_the_script_its_own_argv(tmp_path):
    toy = tmp_path / "argv_proxy.py"
    toy.write_text("import sys\nprint(repr(sys.argv), __name__)\n")
    r = subprocess.run([sys.executable, str(LAUNCHER), str(toy), "--host", "1.2.3.4"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{[str(toy), '--host', '1.2.3.4']!r} __main__"


@pytest.mark.parametrize("version", sorted(RELEASES))
@pytest.mark.parametrize("role", sorted(ROLES))
def test_a_role_with_no_instance_in_service_is_refused_with_503(version, role):
    ns = release_namespace(version)
    script_globals = ns["_handle_completions"].__globals__
    served = []

    async def release_handler(api, request):  # stands for the script's own: records what reached it
        served.append(api)
        return "served"

    script_globals["_handle_completions"] = release_handler
    launcher().refuse_when_out(script_globals)
    state = script_globals["proxy_state"] = two_instances(ns)
    wrapped = script_globals["_handle_completions"]
    *_, taint = ROLES[role]
    servers = state.prefillers if role == "prefill" else state.decoders
    getattr(state, taint)([servers[0]])  # one of two out: still served
    assert asyncio.run(wrapped("/completions", None)) == "served"
    getattr(state, taint)([servers[1]])  # both out
    with pytest.raises(HTTPException) as refused:
        asyncio.run(wrapped("/chat/completions", None))
    assert refused.value.status_code == 503 and refused.value.headers == {"Retry-After": "5"}
    assert f"no {role} instance in service" in refused.value.detail
    servers.clear()  # dropped from the lists once idle: still refused, not the script's RuntimeError (500)
    with pytest.raises(HTTPException):
        asyncio.run(wrapped("/completions", None))
    assert served == ["/completions"]
