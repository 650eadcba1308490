"""Run vLLM-Ascend's PD proxy script (load_balance_proxy_server_example.py) as `python3 SCRIPT ARGS...`
would, unchanged on disk, with two fixes applied as its server starts (ascend-pd:proxy.keepRemovedOut).

Usage: python3 pd_proxy_launch.py SCRIPT [ARGS...]

The release's `/instances/remove` taints an instance while any request is in flight: its heap entry
gets TAINT_PRIORITY so that selection passes it over. But `_update_prefiller_priority` and
`_update_decoder_priority`, which run whenever one of that instance's earlier requests is released,
give it its load-based priority back. It is then the least loaded instance and takes the next
request, whose release untaints it again: under steady load a removed instance keeps receiving
requests, never drains, and requests that reach it while it restarts fail. The fix keeps every
tainted instance at TAINT_PRIORITY after each of those updates (and leaves a valid heap, which the
original does not), until `/instances/add`, which clears the taint itself, puts it back.
Selection, routing and the idle-time removal are the release's own.

When every instance of a role is out (the role's only instance restarting), the script as shipped
still sends each request to it, for it is the only choice left, and only drops it from its lists at
a moment when no request is in flight anywhere: under steady load there is none, and the requests
it sends to the stopped ranks come back as an empty 200. The second fix refuses a request at once
with 503 and Retry-After while a role has no instance in service, before any prefill work is
done (and not counted in flight); the requests in flight finish, the proxy goes idle and drops
the instance, and the client knows to come back. Once `/instances/add` lists an instance again, requests flow.

The patch goes in when the script calls `uvicorn.run`, after it has defined its classes: while
runpy runs a file as `__main__`, `sys.modules["__main__"]` is the namespace it executes in.
"""

import heapq
import runpy
import sys

import uvicorn
from fastapi import HTTPException

ROLES = (  # (role, priority update, servers, tainted, heap) of ProxyState
    ("prefill", "_update_prefiller_priority", "prefillers", "tainted_prefillers", "prefiller_heap"),
    ("decode", "_update_decoder_priority", "decoders", "tainted_decoders", "decoder_heap"),
)


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


RETRY_AFTER_S = "5"


def refuse_when_out(script_globals: dict) -> None:
    """Wrap the script's _handle_completions (its routes look it up in its globals at each request):
    a refusal is not counted in flight, and the script logs no traceback for it."""
    original = script_globals["_handle_completions"]

    async def completions(api, request):
        state = script_globals["proxy_state"]
        for role, _, servers, tainted, _ in ROLES:
            out = getattr(state, tainted)
            if all(s in out for s in getattr(state, servers)):  # also when the list is empty
                raise HTTPException(503, f"no {role} instance in service (restarting): retry later",
                                    headers={"Retry-After": RETRY_AFTER_S})
        return await original(api, request)

    script_globals["_handle_completions"] = completions


NEEDED = ("ProxyState", "TAINT_PRIORITY", "_handle_completions", "proxy_state")


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: pd_proxy_launch.py SCRIPT [ARGS...]")
    real_run = uvicorn.run

    def run(*args, **kwargs):
        namespace = sys.modules["__main__"].__dict__
        missing = [n for n in NEEDED if n not in namespace] + [
            m for _, m, *_ in ROLES if not hasattr(namespace.get("ProxyState"), m)]
        if missing:  # another release: refuse rather than run a proxy whose drain is not what the README says
            sys.exit(f"pd_proxy_launch.py: {sys.argv[0]} has no {', '.join(missing)}: this release cannot keep a "
                     "removed instance out; set ascend-pd:proxy.keepRemovedOut to false to run it as shipped")
        keep_taints(namespace)
        refuse_when_out(namespace)
        print("pd_proxy_launch: an instance given to /instances/remove stays out until /instances/add; "
              "a role with no instance in service answers 503", flush=True)
        return real_run(*args, **kwargs)

    uvicorn.run = run
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
