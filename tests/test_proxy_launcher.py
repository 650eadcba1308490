"""The proxy launcher (ascend_pd/shell/pd_proxy_launch.py) against each release's own proxy script,
fetched by setup.sh, one test per behaviour it fixes, on the release's own scheduling classes.

proxy-state releases (0.18.0, 0.20.2rc1): as shipped, a removed instance comes back into selection as
soon as one of its earlier requests ends; through the launcher it stays out until /instances/add.
shared-scheduler releases (0.23.0.post1): the release keeps a removed instance out by itself, but an
/instances/add of one it still lists, tainted, does nothing; through the launcher it serves again.
Both: a role with no instance in service is refused with 503 instead of being sent to its stopping ranks.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi import HTTPException

from proxy_release import RELEASES, script_path

LAUNCHER = Path(__file__).resolve().parents[1] / "ascend_pd" / "shell" / "pd_proxy_launch.py"
FACTS = Path(__file__).resolve().parents[1] / "ascend_pd" / "data" / "releases"
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


def interface(version: str) -> str:
    defines = json.loads((FACTS / f"{version}.json").read_text())["proxy"]["defines"]
    return launcher().interface_of(defines)


PROXY_STATE = [v for v in RELEASES if interface(v) == "proxy-state"]
SHARED = [v for v in RELEASES if interface(v) == "shared-scheduler"]


def test_every_release_has_an_interface_the_launcher_knows():
    assert sorted(PROXY_STATE + SHARED) == sorted(RELEASES)
    assert PROXY_STATE and SHARED


def release_globals(version: str) -> dict:
    """The script's own module globals (its functions look names up there at each call)."""
    path = script_path(version)
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `bash setup.sh`")
    ns = runpy.run_path(str(path), run_name="release_under_test")  # defines app and classes, serves nothing
    script_globals = next(v for v in ns.values() if callable(v) and getattr(v, "__module__", None) ==
                          "release_under_test" and hasattr(v, "__globals__")).__globals__
    if "ProxyState" in script_globals:
        # ProxyState starts a NodeListener thread that removes tainted instances once nothing is in
        # flight; these tests keep requests in flight by hand, so it has nothing to do.
        script_globals["NodeListener"] = lambda state: None
    return script_globals


# -- proxy-state ----------------------------------------------------------------------------------


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


@pytest.mark.parametrize("version", PROXY_STATE)
@pytest.mark.parametrize("role", sorted(ROLES))
def test_as_shipped_a_removed_instance_takes_requests_again(version, role):
    # The release's behaviour the launcher exists for. If this fails, the release fixed it: check
    # whether proxy.keepRemovedOut is still needed.
    _, chosen = after_release(release_globals(version), role)
    assert 0 in chosen, chosen


@pytest.mark.parametrize("version", PROXY_STATE)
@pytest.mark.parametrize("role", sorted(ROLES))
def test_through_the_launcher_a_removed_instance_stays_out_until_added(version, role):
    ns = release_globals(version)
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


@pytest.mark.parametrize("version", PROXY_STATE)
@pytest.mark.parametrize("role", sorted(ROLES))
def test_a_role_with_no_instance_in_service_is_refused_with_503(version, role):
    script_globals = release_globals(version)
    served = []

    async def release_handler(api, request):  # stands for the script's own: records what reached it
        served.append(api)
        return "served"

    script_globals["_handle_completions"] = release_handler
    launcher().refuse_when_out(script_globals)
    state = script_globals["proxy_state"] = two_instances(script_globals)
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


# -- shared-scheduler -----------------------------------------------------------------------------

PREFILLERS = [("10.0.0.1", 8000), ("10.0.0.2", 8000)]
DECODERS = [("10.0.0.3", 9000), ("10.0.0.4", 9000)]


class Body:
    """What adjust_instances_impl reads of a request: its JSON body."""

    def __init__(self, body: dict):
        self.body = body

    async def json(self) -> dict:
        return self.body


def scheduler_of(ns: dict):
    scheduler = ns["SharedProxyScheduler"](PREFILLERS, DECODERS)
    ns["runtime"] = ns["WorkerRuntime"](scheduler)  # what the script's lifespan sets up
    return scheduler


def role_of(ns: dict, role: str):
    return ns["ServerRole"](role)


def picks(scheduler, role, n: int = 6) -> list[str]:
    """`n` requests' choice of a `role` server, each released again (as a finished request is)."""
    out = []
    for _ in range(n):
        key = scheduler._pick_server(role, TOKENS, active_tokens=True, kv_cache=True)["key"]
        scheduler._release_load(role, key, TOKENS, active_tokens=True, kv_cache=True)
        out.append(key)
    return out


def tainted_first(ns: dict, role: str):
    """The first instance of `role` removed while a request is in flight: tainted, still listed."""
    scheduler = scheduler_of(ns)
    r = role_of(ns, role)
    first = ns["server_key"](*(PREFILLERS if role == "prefill" else DECODERS)[0])
    scheduler.request_num = 1
    assert scheduler.remove_instances(r, [(PREFILLERS if role == "prefill" else DECODERS)[0]]) is True
    return scheduler, r, first


@pytest.mark.parametrize("version", SHARED)
@pytest.mark.parametrize("role", sorted(ROLES))
def test_as_shipped_a_removed_instance_stays_out(version, role):
    # The release fixed what keep_taints does for proxy-state releases. If this fails, it regressed:
    # the launcher must keep taints for this interface too.
    scheduler, r, first = tainted_first(release_globals(version), role)
    assert first not in picks(scheduler, r)


@pytest.mark.parametrize("version", SHARED)
@pytest.mark.parametrize("role", sorted(ROLES))
def test_as_shipped_adding_back_a_tainted_instance_does_nothing(version, role):
    # The release's behaviour scheduler_readd_tainted exists for. If this fails, the release fixed it.
    ns = release_globals(version)
    scheduler, r, first = tainted_first(ns, role)
    host, port = (PREFILLERS if role == "prefill" else DECODERS)[0]
    answer = asyncio.run(ns["adjust_instances_impl"]("add", Body({"type": role, "instances": [f"{host}:{port}"]})))
    assert f"{host}:{port}" in answer[f"current_{role}_instances"]  # listed: an add loop would stop here
    assert first in scheduler._pool(r).tainted and first not in picks(scheduler, r)


@pytest.mark.parametrize("version", SHARED)
@pytest.mark.parametrize("role", sorted(ROLES))
@pytest.mark.parametrize("answers", [True, False], ids=["models-answers", "models-silent"])
def test_through_the_launcher_an_added_tainted_instance_serves_again(version, role, answers):
    ns = release_globals(version)
    checked = []

    async def check_instance_status(host, port):  # the script's NodeListener asks the rank's /v1/models
        checked.append((host, port))
        return answers

    ns["NodeListener"].check_instance_status = staticmethod(check_instance_status)
    launcher().scheduler_readd_tainted(ns)
    scheduler, r, first = tainted_first(ns, role)
    host, port = (PREFILLERS if role == "prefill" else DECODERS)[0]
    asyncio.run(ns["adjust_instances_impl"]("add", Body({"type": role, "instances": f"{host}:{port}"})))
    assert checked == [(host, port)]
    if answers:  # back in service at once, as proxy-state releases do
        assert first not in scheduler._pool(r).tainted and first in picks(scheduler, r)
    else:  # on the script's own waiting list: its NodeListener puts it back once it answers
        assert first in scheduler.waiting_nodes and first not in picks(scheduler, r)
        scheduler.activate_waiting_instance(r, host, port)
        assert first in picks(scheduler, r)


@pytest.mark.parametrize("version", SHARED)
@pytest.mark.parametrize("role", sorted(ROLES))
def test_shared_scheduler_role_with_no_instance_in_service_is_refused_with_503(version, role):
    ns = release_globals(version)
    served = []

    async def release_handler(api, request):
        served.append(api)
        return "served"

    ns["handle_completions_impl"] = release_handler
    launcher().scheduler_refuse_when_out(ns)
    scheduler = scheduler_of(ns)
    r = role_of(ns, role)
    wrapped = ns["handle_completions_impl"]
    both = PREFILLERS if role == "prefill" else DECODERS
    scheduler.request_num = 1
    scheduler.remove_instances(r, both[:1])  # one of two out: still served
    assert asyncio.run(wrapped("/completions", None)) == "served"
    scheduler.remove_instances(r, both[1:])  # both out
    with pytest.raises(HTTPException) as refused:
        asyncio.run(wrapped("/chat/completions", None))
    assert refused.value.status_code == 503 and refused.value.headers == {"Retry-After": "5"}
    assert f"no {role} instance in service" in refused.value.detail
    scheduler.request_num = 0
    scheduler.finalize_tainted_instances()  # dropped once idle: still refused, not a 500
    assert not scheduler._pool(r).servers
    with pytest.raises(HTTPException):
        asyncio.run(wrapped("/completions", None))
    assert served == ["/completions"]


# -- the launcher itself --------------------------------------------------------------------------


def test_the_launcher_refuses_a_script_it_cannot_fix(tmp_path):
    toy = tmp_path / "other_proxy.py"
    toy.write_text("import uvicorn\n\nif __name__ == '__main__':\n    uvicorn.run(None)\n")
    r = subprocess.run([sys.executable, str(LAUNCHER), str(toy), "--port", "1"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    assert "has none of the interfaces the launcher knows (proxy-state: ProxyState, TAINT_PRIORITY" in r.stderr
    assert "ascend-pd:proxy.keepRemovedOut to false" in r.stderr, r.stderr


def test_the_launcher_passes_the_script_its_own_argv(tmp_path):
    toy = tmp_path / "argv_proxy.py"
    toy.write_text("import sys\nprint(repr(sys.argv), __name__)\n")
    r = subprocess.run([sys.executable, str(LAUNCHER), str(toy), "--host", "1.2.3.4"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{[str(toy), '--host', '1.2.3.4']!r} __main__"


def fake_uvicorn(tmp_path: Path) -> dict:
    """An environment whose `uvicorn` is a stand-in that prints what run() was given and serves nothing."""
    (tmp_path / "uvicorn.py").write_text(
        "import sys\n"
        "def run(app, **kw):\n"
        "    module = sys.modules[app.partition(':')[0]] if isinstance(app, str) else sys.modules['__main__']\n"
        "    print('run', app, module.__name__, module.adjust_instances_impl.__name__,\n"
        "          module.handle_completions_impl.__name__, flush=True)\n")
    return {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}


def test_an_import_string_script_is_patched_in_the_module_uvicorn_imports(tmp_path):
    # As 0.23's script starts: uvicorn.run("<its module>:create_app", factory=True, app_dir=<its dir>).
    # uvicorn then imports the script a second time, as a module: the patches must land there.
    toy = tmp_path / "scripts" / "toy_proxy.py"
    toy.parent.mkdir()
    names = launcher().INTERFACES["shared-scheduler"]
    toy.write_text("".join(f"def {n}(*a): pass\n" for n in names) + "import uvicorn\n"
                   "if __name__ == '__main__':\n"
                   f"    uvicorn.run('toy_proxy:create_app', factory=True, app_dir={str(toy.parent)!r})\n")
    r = subprocess.run([sys.executable, str(LAUNCHER), str(toy)], capture_output=True, text=True, timeout=60,
                       env=fake_uvicorn(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "pd_proxy_launch: shared-scheduler" in r.stdout
    assert "run toy_proxy:create_app toy_proxy adjust completions" in r.stdout, r.stdout


def test_more_than_one_proxy_worker_is_refused(tmp_path):
    toy = tmp_path / "workers_proxy.py"
    toy.write_text("import uvicorn\nif __name__ == '__main__':\n"
                   "    uvicorn.run('workers_proxy:app', workers=2, app_dir='.')\n")
    r = subprocess.run([sys.executable, str(LAUNCHER), str(toy)], capture_output=True, text=True, timeout=60,
                       env=fake_uvicorn(tmp_path))
    assert r.returncode != 0 and "run it with one worker" in r.stderr, r.stderr
