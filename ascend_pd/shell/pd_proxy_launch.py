"""Run vLLM-Ascend's PD proxy script (load_balance_proxy_server_example.py) as `python3 SCRIPT ARGS...`
would, unchanged on disk, with fixes applied as its server starts (ascend-pd:proxy.keepRemovedOut).

Usage: python3 pd_proxy_launch.py [--api-key-file FILE] [--admin-from ADDR,...] [--as-shipped] SCRIPT [ARGS...]

(--as-shipped: only the access rules below, none of the fixes: ascend-pd:proxy.keepRemovedOut false.)

Access (ascend-pd:proxy.auth): with --api-key-file, the client routes (`/v1/...`) answer only requests
that carry `Authorization: Bearer <the file's key>` (401 otherwise), compared in constant time; with
--admin-from, the routes that change the proxy or reach every backend (`/instances/...`,
`/reset_prefix_cache`) answer only those source addresses, the cluster's own nodes (403 otherwise,
key or not), and `/healthcheck` answers them or a request with the key. The key never enters argv.

The script comes in two interfaces (INTERFACES; ascend-pd's release checks refuse a release that has
neither before it deploys):

`proxy-state` (vllm-ascend 0.18 to 0.20): a `ProxyState` in the script's own process. Its
`/instances/remove` taints an instance while any request is in flight: its heap entry gets
TAINT_PRIORITY so that selection passes it over. But `_update_prefiller_priority` and
`_update_decoder_priority`, which run whenever one of that instance's earlier requests is released,
give it its load-based priority back. It is then the least loaded instance and takes the next
request, whose release untaints it again: under steady load a removed instance keeps receiving
requests, never drains, and requests that reach it while it restarts fail. The fix keeps every
tainted instance at TAINT_PRIORITY after each of those updates (and leaves a valid heap, which the
original does not), until `/instances/add`, which clears the taint itself, puts it back.

`shared-scheduler` (vllm-ascend 0.21 on): a `SharedProxyScheduler`, which keeps a tainted instance
at TAINT_PRIORITY by itself. Its `/instances/add` skips every instance it still lists, and a tainted
one is listed until no request is in flight anywhere: under steady load a drained instance that is
added back stays tainted (out of service) for as long as the load lasts, and is dropped when it ends.
The fix puts a tainted instance back as the earlier interface did: at once when its `/v1/models`
answers, else through the script's own waiting list (checked every --waiting-retry-interval).

Both: when every instance of a role is out (the role's only instance restarting), the script as
shipped still sends each request to it, for it is the only choice left, and only drops it from its
lists at a moment when no request is in flight anywhere: under steady load there is none, and the
requests it sends to the stopped ranks come back as an empty 200. The fix refuses a request at once
with 503 and Retry-After while a role has no instance in service, before any prefill work is done
(and not counted in flight); the requests in flight finish, the proxy goes idle and drops the
instance, and the client knows to come back. Once `/instances/add` lists an instance again, requests flow.

The patch goes in when the script calls `uvicorn.run`, after it has defined its classes: either in
`sys.modules["__main__"]` (the namespace runpy executes the script in), or, when the script hands
uvicorn an import string (`"load_balance_proxy_server_example:create_app"`), in that module, which the
launcher imports first so that uvicorn finds it already imported, patched.

This file runs inside the NPU container and is also imported by ascend-pd's release checks (INTERFACES):
it imports nothing beyond the standard library until it runs.
"""

import heapq
import hmac
import importlib
import json
import runpy
import sys

INTERFACES = {  # name -> what the script must define for the launcher to wrap it
    "proxy-state": ("ProxyState", "TAINT_PRIORITY", "_handle_completions", "proxy_state"),
    "shared-scheduler": ("SharedProxyScheduler", "TAINT_PRIORITY", "handle_completions_impl", "adjust_instances_impl",
                         "get_runtime", "ServerRole", "NodeListener", "server_key", "parse_server_addresses"),
}
ROLES = (  # (role, priority update, servers, tainted, heap) of a proxy-state ProxyState
    ("prefill", "_update_prefiller_priority", "prefillers", "tainted_prefillers", "prefiller_heap"),
    ("decode", "_update_decoder_priority", "decoders", "tainted_decoders", "decoder_heap"),
)
RETRY_AFTER_S = "5"


def interface_of(names) -> "str | None":
    """The interface a script with these module-level names has, or None."""
    return next((name for name, needed in INTERFACES.items() if all(n in names for n in needed)), None)


def _refusal(role: str):
    from fastapi import HTTPException

    return HTTPException(503, f"no {role} instance in service (restarting): retry later",
                         headers={"Retry-After": RETRY_AFTER_S})


# -- proxy-state ----------------------------------------------------------------------------------


def keep_taints(namespace: dict) -> None:
    state_cls, taint = namespace["ProxyState"], namespace["TAINT_PRIORITY"]
    for _, method, _, tainted, heap in ROLES:
        original = getattr(state_cls, method)

        def update(self, server_idx, _original=original, _tainted=tainted, _heap=heap):
            _original(self, server_idx)
            out = getattr(self, _tainted)
            # Every entry, not only server_idx: the original filters the heap list without re-heapifying,
            # so a tainted entry can drift to the top through updates of other servers.
            entries = [(taint if s in out else p, i, s) for p, i, s in getattr(self, _heap)]
            heapq.heapify(entries)
            setattr(self, _heap, entries)

        setattr(state_cls, method, update)


def refuse_when_out(script_globals: dict) -> None:
    """Wrap the script's _handle_completions (its routes look it up in its globals at each request):
    a refusal is not counted in flight, and the script logs no traceback for it."""
    original = script_globals["_handle_completions"]

    async def completions(api, request):
        state = script_globals["proxy_state"]
        for role, _, servers, tainted, _ in ROLES:
            out = getattr(state, tainted)
            if all(s in out for s in getattr(state, servers)):  # also when the list is empty
                raise _refusal(role)
        return await original(api, request)

    script_globals["_handle_completions"] = completions


# -- shared-scheduler -----------------------------------------------------------------------------


def scheduler_refuse_when_out(script_globals: dict) -> None:
    """Wrap the script's handle_completions_impl (looked up in its globals at each request)."""
    original = script_globals["handle_completions_impl"]
    roles = script_globals["ServerRole"]

    async def completions(api, request):
        scheduler = script_globals["get_runtime"]().scheduler
        with scheduler._lock:
            for role in roles:
                pool = scheduler._pool(role)
                if all(key in pool.tainted for key in pool.servers):  # also when there is none
                    raise _refusal(role.value)
        return await original(api, request)

    script_globals["handle_completions_impl"] = completions


def scheduler_readd_tainted(script_globals: dict) -> None:
    """Wrap the script's adjust_instances_impl: an `add` of an instance that is still listed, tainted,
    puts it back in service (its /v1/models answers) or on the script's waiting list (it does not yet)."""
    original = script_globals["adjust_instances_impl"]
    roles, key_of = script_globals["ServerRole"], script_globals["server_key"]

    async def adjust(adjust_mode, request):
        if adjust_mode == "add":
            body = await request.json()  # starlette keeps the body: the script reads it again
            try:
                role = roles(body.get("type", ""))
                instances = body.get("instances", [])
                parsed = script_globals["parse_server_addresses"]([instances] if isinstance(instances, str) else instances)
            except (ValueError, AttributeError, TypeError):
                return await original(adjust_mode, request)  # the script's own answer to a bad body
            scheduler = script_globals["get_runtime"]().scheduler
            for host, port in parsed:
                key = key_of(host, port)
                if key not in scheduler._pool(role).tainted:
                    continue
                if await script_globals["NodeListener"].check_instance_status(host, port):
                    scheduler.activate_waiting_instance(role, host, port)
                else:
                    with scheduler._lock:
                        scheduler.waiting_nodes[key] = (role.value, (host, int(port)), 0)
        return await original(adjust_mode, request)

    script_globals["adjust_instances_impl"] = adjust


# -- access ---------------------------------------------------------------------------------------

CLIENT_PREFIX = "/v1/"
ADMIN_PATHS = ("/instances/", "/reset_prefix_cache")
OPEN_TO_KEY_OR_ADMIN = ("/healthcheck",)


class Guard:
    """ASGI middleware in front of the script's app: who may call which route (module docstring)."""

    def __init__(self, app, key: "str | None", admins: "frozenset[str]"):
        self.app, self.key, self.admins = app, key, admins

    def _has_key(self, scope) -> bool:
        if self.key is None:
            return True
        sent = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        return hmac.compare_digest(sent.encode(), f"Bearer {self.key}".encode())

    def verdict(self, scope) -> "tuple[int, str] | None":
        path = scope.get("path", "")
        client = (scope.get("client") or ("", 0))[0]
        admin = not self.admins or client in self.admins
        if path.startswith(ADMIN_PATHS):
            return None if admin else (403, f"{path} answers the cluster's nodes only")
        if path in OPEN_TO_KEY_OR_ADMIN:
            return None if admin or self._has_key(scope) else (401, "a key is required: Authorization: Bearer ...")
        return None if self._has_key(scope) else (401, "a key is required: Authorization: Bearer ...")

    async def __call__(self, scope, receive, send):
        refused = self.verdict(scope) if scope.get("type") == "http" else None
        if refused is None:
            return await self.app(scope, receive, send)
        status, detail = refused
        body = json.dumps({"detail": detail}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def guard(namespace: dict, key: "str | None", admins: "frozenset[str]") -> None:
    """Put the Guard in front of the script's FastAPI app (before uvicorn starts it)."""
    if key is None and not admins:
        return
    namespace["app"].add_middleware(Guard, key=key, admins=admins)


def launcher_options(argv: list) -> "tuple[str | None, frozenset[str], bool, list]":
    """(the key, the admin addresses, whether to apply the fixes, the script's own argv) from this
    launcher's argv."""
    key, admins, fixes, rest = None, frozenset(), True, list(argv)
    while rest and rest[0] in ("--api-key-file", "--admin-from", "--as-shipped"):
        if rest[0] == "--as-shipped":  # proxy.keepRemovedOut false: only the access rules
            fixes, rest = False, rest[1:]
            continue
        option, value, rest = rest[0], rest[1], rest[2:]
        if option == "--api-key-file":
            with open(value, encoding="utf-8") as f:
                key = f.read().strip()
            if not key:
                sys.exit(f"pd_proxy_launch.py: {value} is empty: the proxy would take any key")
        else:
            admins = frozenset(a for a in value.split(",") if a)
    return key, admins, fixes, rest


# -- launching ------------------------------------------------------------------------------------


def patch(namespace: dict) -> None:
    interface = interface_of(namespace)
    if interface == "proxy-state":
        missing = [m for _, m, *_ in ROLES if not hasattr(namespace["ProxyState"], m)]
        if missing:
            interface = None
    if interface is None:  # another release: refuse rather than run a proxy whose drain is not what the README says
        known = "; ".join(f"{name}: {', '.join(needed)}" for name, needed in INTERFACES.items())
        sys.exit(f"pd_proxy_launch.py: {sys.argv[0]} has none of the interfaces the launcher knows ({known}): this "
                 "release cannot keep a removed instance out; set ascend-pd:proxy.keepRemovedOut to false to run it "
                 "as shipped")
    if interface == "proxy-state":
        keep_taints(namespace)
        refuse_when_out(namespace)
    else:
        scheduler_readd_tainted(namespace)
        scheduler_refuse_when_out(namespace)
    print(f"pd_proxy_launch: {interface}: an instance given to /instances/remove stays out until /instances/add; "
          "a role with no instance in service answers 503", flush=True)


def main() -> None:
    key, admins, fixes, argv = launcher_options(sys.argv[1:])
    if not argv:
        sys.exit("usage: pd_proxy_launch.py [--api-key-file FILE] [--admin-from ADDR,...] [--as-shipped] SCRIPT "
                 "[ARGS...]")
    import uvicorn

    real_run = uvicorn.run

    def run(app, *args, **kwargs):
        if isinstance(app, str):
            if kwargs.get("workers") not in (None, 1):
                sys.exit("pd_proxy_launch.py: the proxy runs more than one worker process; the launcher's fixes "
                         "reach only its own: run it with one worker (no --workers)")
            if kwargs.get("app_dir") is not None:
                sys.path.insert(0, kwargs["app_dir"])
            namespace = importlib.import_module(app.partition(":")[0]).__dict__
        else:
            namespace = sys.modules["__main__"].__dict__
        if fixes:
            patch(namespace)
        guard(namespace, key, admins)
        return real_run(app, *args, **kwargs)

    uvicorn.run = run
    sys.argv = argv
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
