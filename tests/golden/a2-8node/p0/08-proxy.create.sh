#!/usr/bin/env bash
# ascend-pd a2-8node: PD proxy http://192.0.2.10:18020 on p0
set -euo pipefail
node=p0
run_dir=/workspace/ascend-pd/run
log_dir=/workspace/ascend-pd/logs
pidfile=/workspace/ascend-pd/run/proxy.pid
log=/workspace/ascend-pd/logs/proxy.log
url=http://192.0.2.10:18020
py=python3
model=deepseek_v4
n_prefill=8
n_decode=32
ready_timeout_s=300
smoke_timeout_s=600
log_tail=50
ranks='{"prefill":["http://192.0.2.10:7100","http://192.0.2.10:7101","http://192.0.2.11:7100","http://192.0.2.11:7101","http://192.0.2.12:7100","http://192.0.2.12:7101","http://192.0.2.13:7100","http://192.0.2.13:7101"],"decode":["http://192.0.2.20:7100","http://192.0.2.20:7101","http://192.0.2.20:7102","http://192.0.2.20:7103","http://192.0.2.20:7104","http://192.0.2.20:7105","http://192.0.2.20:7106","http://192.0.2.20:7107","http://192.0.2.21:7100","http://192.0.2.21:7101","http://192.0.2.21:7102","http://192.0.2.21:7103","http://192.0.2.21:7104","http://192.0.2.21:7105","http://192.0.2.21:7106","http://192.0.2.21:7107","http://192.0.2.22:7100","http://192.0.2.22:7101","http://192.0.2.22:7102","http://192.0.2.22:7103","http://192.0.2.22:7104","http://192.0.2.22:7105","http://192.0.2.22:7106","http://192.0.2.22:7107","http://192.0.2.23:7100","http://192.0.2.23:7101","http://192.0.2.23:7102","http://192.0.2.23:7103","http://192.0.2.23:7104","http://192.0.2.23:7105","http://192.0.2.23:7106","http://192.0.2.23:7107"]}'
key_file=/workspace/ascend-pd/run/secrets/proxy-api-key
# The environment an interactive shell in this container has (CANN's set_env.sh files).
set +eu
# shellcheck source=/dev/null
if [ -f /usr/local/Ascend/ascend-toolkit/set_env.sh ]; then . /usr/local/Ascend/ascend-toolkit/set_env.sh; fi
# shellcheck source=/dev/null
if [ -f /usr/local/Ascend/nnal/atb/set_env.sh ]; then . /usr/local/Ascend/nnal/atb/set_env.sh; fi
set -eu
alive() {  # alive PID: running and not a zombie
  local stat
  stat=$(sed -e 's/^.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
  [ "${stat%% *}" != Z ]
}

start_time() {  # start_time PID: when it started (clock ticks since boot, /proc/PID/stat field 22)
  sed -e 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20
}

pid_of() {  # pid_of PIDFILE: print the pid it records if THAT process still runs, else fail
  # A pid alone is not an identity: after a reboot or a container restart pids start again from
  # 1, and a stale pid file may name some other process. Its start time, recorded beside it, is.
  local pid recorded
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && alive "$pid" || return 1
  # A pid file written before start times were recorded (an older ascend-pd) is trusted as before.
  if recorded=$(cat "${1%.pid}.start" 2>/dev/null); then
    [ "$(start_time "$pid")" = "$recorded" ] || return 1
  fi
  echo "$pid"
}

stop_pidfiles() {  # stop_pidfiles GRACE PIDFILE...: TERM every process group at once, KILL what is left after GRACE s
  local grace=$1 pidfile pid deadline waiting
  shift
  local pids=()
  # Every pid first, then the signals: the ranks of a DP group die with each other, so a rank
  # TERMed first would take its peers' leaders down before their pid files are read, and their
  # groups (engine cores, a stopped one among them) would never get the KILL below.
  for pidfile in "$@"; do
    # Read once: the file may go away between a test and a second read.
    if pid=$(pid_of "$pidfile"); then pids+=("$pid"); fi
  done
  for pid in ${pids[@]+"${pids[@]}"}; do
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  deadline=$((SECONDS + grace))
  while :; do
    waiting=""
    for pid in ${pids[@]+"${pids[@]}"}; do if alive "$pid"; then waiting="$waiting $pid"; fi; done
    if [ -z "$waiting" ] || [ "$SECONDS" -ge "$deadline" ]; then break; fi
    sleep 0.5
  done
  if [ -n "$waiting" ]; then echo "pid(s)$waiting ignored TERM for ${grace}s: KILL" >&2; fi
  # KILL every group regardless: children (engine cores) must not outlive their leader.
  for pid in ${pids[@]+"${pids[@]}"}; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  deadline=$((SECONDS + 10))
  for pid in ${pids[@]+"${pids[@]}"}; do
    while alive "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.5; done
  done
  for pidfile in "$@"; do rm -f "$pidfile" "${pidfile%.pid}.spec" "${pidfile%.pid}.start"; done
}

running_with() {  # running_with PIDFILE SPEC: 0 if its process runs with the command fingerprint SPEC
  pid_of "$1" >/dev/null && [ "$(cat "${1%.pid}.spec" 2>/dev/null)" = "$2" ]
}

needs_start() {  # needs_start PIDFILE SPEC GRACE: 0 if it must (re)start, 1 if running with SPEC
  local pidfile=$1 spec=$2 grace=$3 name
  name=$(basename "${pidfile%.pid}")
  if running_with "$pidfile" "$spec"; then
    echo "$name: already running (pid $(cat "$pidfile"))"
    return 1
  fi
  if pid_of "$pidfile" >/dev/null; then
    echo "$name: running with an older command: restarting"
    stop_pidfiles "$grace" "$pidfile"
  fi
  return 0
}

started() {  # started PIDFILE SPEC PID: record a process this script just put in the background
  echo "$3" > "$1"
  start_time "$3" > "${1%.pid}.start"
  echo "$2" > "${1%.pid}.spec"
  echo "$(basename "${1%.pid}"): started pid $3"
}

rotate_log() {  # rotate_log LOG: keep the previous run's log beside the new one
  if [ -f "$1" ]; then mv -f "$1" "$1.1"; fi
}

show_log() {  # show_log LOG: its last lines on stderr
  echo "--- last lines of $1:" >&2
  tail -n "$log_tail" "$1" >&2 2>/dev/null || echo "(no log)" >&2
}

fail_with_log() {  # fail_with_log LOG MESSAGE
  echo "$2" >&2
  show_log "$1"
  exit 1
}

container_incarnation() {  # the start time of this container's PID 1: new after a restart or a replacement
  sed -e 's/^.*) //' /proc/1/stat | cut -d' ' -f20
}

step_done() {  # step_done MARKER SPEC: 0 if MARKER records SPEC in this container incarnation
  [ "$(cat "$1" 2>/dev/null)" = "$2 $(container_incarnation)" ]
}

mark_done() {  # mark_done MARKER SPEC
  mkdir -p "$(dirname "$1")"
  echo "$2 $(container_incarnation)" > "$1"
}

proxy_check=$(cat <<'ASCEND_PD_PY'
"""The PD proxy's readiness checks, run inside the container by the proxy script (`python -c`).

    proxy_check.py healthcheck PREFILL DECODE     (the /healthcheck JSON on stdin)

healthcheck: exit 0 when the proxy reports exactly PREFILL prefill and DECODE decode instances;
quietly 1 otherwise (it runs every 2 s until the deadline). The smoke completion is pd_smoke.py.
"""

import json
import sys


def healthcheck(prefill: str, decode: str) -> int:
    try:
        h = json.load(sys.stdin)
    except ValueError:
        return 1  # not listening yet: no body
    if not isinstance(h, dict):
        return 1
    return 0 if (h.get("prefill_instances"), h.get("decode_instances")) == (int(prefill), int(decode)) else 1


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    sys.exit(healthcheck(*args) if mode == "healthcheck" else 2)
ASCEND_PD_PY
)
pd_smoke=$(cat <<'ASCEND_PD_PY'
"""A smoke completion that proves the P/D path, not only that something answered.

    pd_smoke.py URL MODEL TIMEOUT_S RANKS_JSON MAX_TOKENS [KEY_FILE]     (RANKS_JSON: {"prefill": [url], "decode": [url]})

KEY_FILE: the proxy's key (ascend-pd:proxy.auth), sent as `Authorization: Bearer`; empty or absent: none.

Reads `/metrics` of every rank, sends one chat completion through the proxy at URL, reads `/metrics`
again, and passes only when (1) the answer has text, (2) a prefill rank finished a request and a
decode rank's `vllm:external_prefix_cache_hits_total` (KV received through the connector) rose
meanwhile, and (3) all of it took at most TIMEOUT_S. Otherwise it says which side did not take part:
a decode-only fallback (the proxy's prefill hand-over gave the decode nothing to load), an HTTP 200
with an empty body (the proxy's answer when its decoder failed), a failed decode, a bypassed prefill.
Prints one line (stdout when it passes, stderr when not) and exits 0 or 1. Standard library only: it
runs inside the container (`python -c`), and `ascend_pd.status` imports `judge` from it.

Other traffic moves the counters too; it can make the check pass only when that traffic itself went
through prefill and decode, which proves the same path.
"""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

SERVED = ("stop", "length")  # finished reasons of a request a rank completed
FAILED = ("abort", "error")
_LINE = re.compile(r'^(vllm:[a-z_]+)(\{[^}]*\})?\s+(\S+)')
_REASON = re.compile(r'finished_reason="([a-z]+)"')


def counters(text: str) -> dict:
    """The request counters of one rank's /metrics text, summed over label sets (engine, model)."""
    c = dict.fromkeys(("running", "waiting", "served", "failed", "prompt_tokens", "generation_tokens",
                       "external_hits"), 0.0)
    names = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
             "vllm:prompt_tokens_total": "prompt_tokens", "vllm:generation_tokens_total": "generation_tokens",
             "vllm:external_prefix_cache_hits_total": "external_hits"}
    for line in text.split("\n"):
        m = _LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if value != value:  # NaN
            continue
        name = m.group(1)
        if name == "vllm:request_success_total":
            reason = _REASON.search(m.group(2) or "")
            key = "served" if reason is None or reason.group(1) in SERVED else "failed"
            c[key] += value
        elif name in names:
            c[names[name]] += value
    return c


def _rose(before: dict, after: dict, key: str) -> list:
    """URLs whose counter `key` went up (a rank that restarted in between starts from zero)."""
    out = []
    for url, b in before.items():
        a = after.get(url)
        if a is not None and b is not None and a[key] > b[key]:
            out.append(url)
    return out


def judge(ranks: dict, before: dict, after: dict, status: int, body: bytes, latency: float, timeout_s: float):
    """(ok, message). `ranks` is {"prefill": [url], "decode": [url]}; `before`/`after` map a rank URL
    to its `counters()` or None (unreadable); `status`/`body` are the proxy's answer."""
    seen = {role: [u for u in urls if before.get(u) is not None and after.get(u) is not None]
            for role, urls in ranks.items()}
    prefill_in = {u: before[u] for u in seen["prefill"]}
    decode_in = {u: before[u] for u in seen["decode"]}
    served_p = _rose(prefill_in, after, "served")
    failed_d = _rose(decode_in, after, "failed")
    kv_d = _rose(decode_in, after, "external_hits")
    served_d = _rose(decode_in, after, "served")
    if latency > timeout_s:
        return False, f"the answer took {latency:.1f}s, more than the {timeout_s:g}s deadline"
    decode_failed = f"decode rank {failed_d[0]} failed the request" if failed_d else ""
    if status != 200:
        side = decode_failed or ("prefill took part" if served_p else "no prefill rank served it")
        return False, f"HTTP {status} from the proxy ({side}): {body[:120].decode(errors='replace')!r}"
    text = ""
    try:
        msg = json.loads(body)["choices"][0]["message"]
        # Reasoning models may answer only in `reasoning` (vLLM >= 0.17) or `reasoning_content` (older).
        text = " ".join(str(msg.get("content") or msg.get("reasoning") or msg.get("reasoning_content") or "").split())
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        if body.strip():
            return False, f"no chat completion in the answer: {body[:120].decode(errors='replace')!r}"
    if not body.strip():
        side = decode_failed or "no decode rank finished it"
        return False, f"HTTP 200 with an empty body: the decode side failed ({side})"
    if not text:
        return False, f"the completion has no text: {body[:120].decode(errors='replace')!r}"
    for role in ("prefill", "decode"):
        if not seen[role]:
            return False, (f"'{text[:40]}', but /metrics of no {role} rank was readable before and after: "
                           f"the P/D path is unproven")
    if not served_p:
        return False, (f"decode-only answer '{text[:40]}': no prefill rank of {len(seen['prefill'])} served the "
                       f"request (prefill bypassed)")
    if not kv_d:
        who = f"decode rank {served_d[0]}" if served_d else "a decode rank"
        return False, (f"decode-only fallback '{text[:40]}': {who} computed the prompt itself; no decode rank "
                       f"received KV from prefill (vllm:external_prefix_cache_hits_total did not rise)")
    return True, f"prefill {served_p[0]} and decode {kv_d[0]} in {latency:.1f}s: '{text[:60]}'"


def _metrics(url: str, timeout: float):
    try:
        with _DIRECT.open(url + "/metrics", timeout=timeout) as resp:
            return counters(resp.read(8 * 1024 * 1024).decode("utf-8", "replace"))
    except Exception:  # noqa: BLE001 - an unreadable rank is judged as such
        return None


def _all_metrics(ranks: dict, timeout: float) -> dict:
    urls = [u for urls in ranks.values() for u in urls]
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(urls)))) as pool:
        return dict(zip(urls, pool.map(lambda u: _metrics(u, timeout), urls)))


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via http_proxy


def main(url: str, model: str, timeout_s: str, ranks_json: str, max_tokens: str = "16", key_file: str = "") -> int:
    timeout, ranks = float(timeout_s), json.loads(ranks_json)
    headers = {"Content-Type": "application/json"}
    if key_file:
        try:
            with open(key_file, encoding="utf-8") as f:
                headers["Authorization"] = "Bearer " + f.read().strip()
        except OSError as exc:
            print(f"smoke completion failed via {url}: cannot read the proxy's key {key_file} ({exc.strerror})",
                  file=sys.stderr)
            return 1
    started = time.monotonic()
    phase = min(5.0, timeout / 4)  # each /metrics round; the completion gets the rest
    before = _all_metrics(ranks, phase)
    req = urllib.request.Request(url + "/v1/chat/completions", headers=headers,
                                 data=json.dumps({
                                     "model": model, "messages": [{"role": "user", "content": "hello"}],
                                     "max_tokens": int(max_tokens), "temperature": 0, "stream": False,
                                     "chat_template_kwargs": {"enable_thinking": False}}).encode())
    t0 = time.monotonic()
    try:
        with _DIRECT.open(req, timeout=max(1.0, timeout - (t0 - started) - phase)) as resp:
            status, body = resp.status, resp.read(1024 * 1024)
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read(1024 * 1024)
    except Exception as exc:  # noqa: BLE001 - the operator sees the reason
        slow = isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError)
        why = f"no answer within {timeout:g}s" if slow else repr(exc)
        print(f"smoke completion failed via {url}: {why}"[:300], file=sys.stderr)
        return 1
    latency = time.monotonic() - t0
    after = _all_metrics(ranks, max(0.5, min(phase, timeout - (time.monotonic() - started))))
    ok, message = judge(ranks, before, after, status, body, latency, timeout)
    print(f"smoke completion {'ok' if ok else 'failed'} via {url}: {message}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
ASCEND_PD_PY
)
if ! command -v "$py" >/dev/null 2>&1; then
  echo "ascend-pd:proxy.python $py is not found in the container on $node: name the interpreter that has fastapi, httpx and uvicorn" >&2
  exit 1
fi
if [ -n "$key_file" ] && [ ! -s "$key_file" ]; then
  echo "the proxy's key $key_file is missing on $node: pulumi up writes it (<node>-proxy-key) from the secret" >&2
  echo "ascend-pd:proxyApiKey (pulumi config set --secret ascend-pd:proxyApiKey KEY), or set ascend-pd:proxy.auth: false" >&2
  exit 1
fi
mkdir -p "$run_dir" "$log_dir"
cat >"$run_dir/pd_proxy_launch.py" <<'ASCEND_PD_PY'
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
ASCEND_PD_PY
if needs_start /workspace/ascend-pd/run/proxy.pid 7e0ac697ac38cd9a 30; then
  rotate_log /workspace/ascend-pd/logs/proxy.log
  setsid nohup env \
      -u http_proxy -u https_proxy -u ftp_proxy -u all_proxy -u grpc_proxy -u HTTP_PROXY -u HTTPS_PROXY -u FTP_PROXY -u ALL_PROXY -u GOOGLE_LOGTOSTDERR -u GOOGLE_ALSOLOGTOSTDERR \
      python3 /workspace/ascend-pd/run/pd_proxy_launch.py \
      --api-key-file /workspace/ascend-pd/run/secrets/proxy-api-key \
      --admin-from 192.0.2.10,192.0.2.11,192.0.2.12,192.0.2.13,192.0.2.20,192.0.2.21,192.0.2.22,192.0.2.23,127.0.0.1 \
      /vllm-workspace/vllm-ascend/examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py \
      --host 192.0.2.10 \
      --port 18020 \
      --prefiller-hosts 192.0.2.10 \
      192.0.2.10 \
      192.0.2.11 \
      192.0.2.11 \
      192.0.2.12 \
      192.0.2.12 \
      192.0.2.13 \
      192.0.2.13 \
      --prefiller-ports 7100 \
      7101 \
      7100 \
      7101 \
      7100 \
      7101 \
      7100 \
      7101 \
      --decoder-hosts 192.0.2.20 \
      192.0.2.20 \
      192.0.2.20 \
      192.0.2.20 \
      192.0.2.20 \
      192.0.2.20 \
      192.0.2.20 \
      192.0.2.20 \
      192.0.2.21 \
      192.0.2.21 \
      192.0.2.21 \
      192.0.2.21 \
      192.0.2.21 \
      192.0.2.21 \
      192.0.2.21 \
      192.0.2.21 \
      192.0.2.22 \
      192.0.2.22 \
      192.0.2.22 \
      192.0.2.22 \
      192.0.2.22 \
      192.0.2.22 \
      192.0.2.22 \
      192.0.2.22 \
      192.0.2.23 \
      192.0.2.23 \
      192.0.2.23 \
      192.0.2.23 \
      192.0.2.23 \
      192.0.2.23 \
      192.0.2.23 \
      192.0.2.23 \
      --decoder-ports 7100 \
      7101 \
      7102 \
      7103 \
      7104 \
      7105 \
      7106 \
      7107 \
      7100 \
      7101 \
      7102 \
      7103 \
      7104 \
      7105 \
      7106 \
      7107 \
      7100 \
      7101 \
      7102 \
      7103 \
      7104 \
      7105 \
      7106 \
      7107 \
      7100 \
      7101 \
      7102 \
      7103 \
      7104 \
      7105 \
      7106 \
      7107 \
      --waiting-retry-interval 1.0 \
      > /workspace/ascend-pd/logs/proxy.log 2>&1 < /dev/null &
  started /workspace/ascend-pd/run/proxy.pid 7e0ac697ac38cd9a $!
fi
# /healthcheck must report every planned instance.
deadline=$((SECONDS + ready_timeout_s))
until curl --noproxy '*' -fsS -m 5 "$url/healthcheck" 2>/dev/null | "$py" -c "$proxy_check" healthcheck "$n_prefill" "$n_decode"; do
  if ! pid_of "$pidfile" >/dev/null; then fail_with_log "$log" "the proxy exited before /healthcheck answered"; fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "last /healthcheck: $(curl --noproxy '*' -sS -m 5 "$url/healthcheck" 2>&1 || true)" >&2
    stop_pidfiles 10 "$pidfile"
    fail_with_log "$log" "proxy /healthcheck did not report $n_prefill prefill + $n_decode decode instances within ${ready_timeout_s}s"
  fi
  sleep 2
done
# One chat completion through the proxy must return text that a prefill and a decode rank both served.
if ! "$py" -c "$pd_smoke" "$url" "$model" "$smoke_timeout_s" "$ranks" 16 "$key_file"; then
  stop_pidfiles 10 "$pidfile"
  fail_with_log "$log" "smoke completion through the proxy failed"
fi
echo "proxy ready at $url ($n_prefill prefill, $n_decode decode)"
