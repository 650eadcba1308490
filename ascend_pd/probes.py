"""Health probes installed in every node's container, rendered from the plan.

`probes(plan, node)` is a `Script` (name "probes", run in the container) whose create writes
executable probe scripts to `<stateDir>/probes/` and whose delete removes that directory:

* `liveness.sh` on every node: the openYuanrong worker's liveness file
  (`ascend-pd:yuanrong.livenessPath`) exists, says `liveness check success` and was rewritten within
  `liveness_max_age_s` seconds (the worker rewrites it about every 100 ms); on the etcd node, etcd's
  `/health` at the plan's client port (the seed's probe checked 12379 while etcd listens on 2379, so it
  always failed); and `/health` of every vLLM rank placed on the node, checked concurrently.
* `readiness.sh` on the proxy node: one chat completion through the PD proxy with the served model
  name; ready when the answer has non-empty `content`, `reasoning` (vLLM >= 0.17) or
  `reasoning_content` (older vLLM).

Each probe checks everything it owns (it does not stop at the first failure), prints ONE line
(`liveness <node>: OK (...)` or `... FAIL (<what failed>; ...)`, naming the failed rank, file or URL),
appends that line with a UTC timestamp to `<probe>.log` beside it, and exits 0 (alive/ready) or 1.
The log is rotated when it reaches `log_max_bytes`; `log_keep` old files (`.1` newest) are kept.
Every network call has a connect timeout and a total timeout; the scripts are strict
(`set -euo pipefail`) and carry only literal values, so they read the same in `pulumi preview --diff`.
Monitoring systems (or a kubelet-style supervisor) run them periodically; a liveness failure means
"restart the serving stack on this node", a readiness failure "do not send traffic yet".
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .plan import Plan
from .scripts import Script, _header, q

PROBE_HEREDOC = "ASCEND_PD_PROBE"

# The seed's yr_liveness_check.sh default: the worker rewrites its file every ~100 ms, so 30 s of
# silence means it is hung or gone, while a loaded node's scheduling hiccups never trip it.
LIVENESS_MAX_AGE_S = 30
# Per HTTP call of the liveness probe: /health answers at once unless the process is stuck.
PROBE_CONNECT_TIMEOUT_S = 2
PROBE_HTTP_TIMEOUT_S = 5
# The readiness completion (8 tokens). The seed waited 1200 s, longer than any probe period;
# 120 s covers a busy cluster without letting probe runs pile up.
READINESS_TIMEOUT_S = 120
READINESS_MAX_TOKENS = 8
# Probe logs: rotated at 1 MiB, 3 old files kept (a few weeks of one line a minute).
LOG_MAX_BYTES = 1024 * 1024
LOG_KEEP = 3


@dataclass(frozen=True)
class ProbeSettings:
    """Tunables of the rendered probes; the defaults are the named constants above."""

    liveness_max_age_s: int = LIVENESS_MAX_AGE_S
    connect_timeout_s: int = PROBE_CONNECT_TIMEOUT_S
    http_timeout_s: int = PROBE_HTTP_TIMEOUT_S
    readiness_timeout_s: int = READINESS_TIMEOUT_S
    log_max_bytes: int = LOG_MAX_BYTES
    log_keep: int = LOG_KEEP

    def __post_init__(self) -> None:
        for name in ("liveness_max_age_s", "connect_timeout_s", "http_timeout_s",
                     "readiness_timeout_s", "log_max_bytes", "log_keep"):
            if getattr(self, name) < 1:
                raise ValueError(f"ProbeSettings.{name} must be >= 1")


DEFAULT_SETTINGS = ProbeSettings()


def probe_dir(plan: Plan) -> str:
    return f"{plan.cfg.state_dir}/probes"


def _verdict_lib(log: str, what: str, node: str, s: ProbeSettings) -> str:
    """fail/pass accumulators and `finish`: print one line, append it to the rotated log, exit."""
    older = " ".join(str(i) for i in range(s.log_keep - 1, 0, -1))
    shift = (f"  for i in {older}; do\n"
             f"    if [ -f {q(log)}.\"$i\" ]; then mv -f {q(log)}.\"$i\" {q(log)}.\"$((i + 1))\"; fi\n"
             f"  done\n") if older else ""
    return f"""
failed=""
passed=""
fail() {{ failed="${{failed}}${{failed:+; }}$1"; }}
pass() {{ passed="${{passed}}${{passed:+; }}$1"; }}
rotate_log() {{  # keep {s.log_keep} old log(s), newest .1, once the log reaches {s.log_max_bytes} bytes
  local size
  size=$(stat -c %s {q(log)} 2>/dev/null) || return 0
  [ "$size" -ge {s.log_max_bytes} ] || return 0
  rm -f {q(log)}.{s.log_keep}
{shift}  mv -f {q(log)} {q(log)}.1
}}
finish() {{  # print the verdict (one line), log it, exit 0 or 1
  local line code
  if [ -z "$failed" ]; then
    line="{what} {node}: OK ($passed)"
    code=0
  else
    line="{what} {node}: FAIL ($failed)"
    code=1
  fi
  echo "$line"
  {{ rotate_log && printf '%s %s\\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$line" >> {q(log)}; }} 2>/dev/null || true
  exit "$code"
}}
"""


def liveness_script(plan: Plan, node: str, settings: ProbeSettings = DEFAULT_SETTINGS) -> str:
    """The text of `liveness.sh` for `node` (exit 0 alive, 1 not; one line on stdout)."""
    s = settings
    d = probe_dir(plan)
    live = plan.cfg.yuanrong.liveness_path
    worker = plan.worker(node)
    ranks = tuple(r for r in plan.ranks if r.node == node)
    # --noproxy: the container's env may carry http_proxy (for pip); probes talk to nodes directly.
    curl = f"curl --noproxy '*' -sS --connect-timeout {s.connect_timeout_s} -m {s.http_timeout_s}"
    checks = [f"""
# 1. openYuanrong worker {worker.address}: its liveness file, rewritten about every 100 ms.
liveness_file={q(live)}
content=""
said_success=no
for attempt in 1 2 3; do  # the worker may be rewriting it this very moment
  content=$(head -c 200 "$liveness_file" 2>/dev/null | tr -d '\\n') || content=""
  case "$content" in *"liveness check success"*) said_success=yes; break ;; esac
  if [ "$attempt" -lt 3 ]; then sleep 0.2; fi
done
if [ ! -e "$liveness_file" ]; then
  fail "openYuanrong worker {worker.address}: liveness file $liveness_file is missing"
elif [ "$said_success" != yes ]; then
  fail "openYuanrong worker {worker.address}: $liveness_file says '${{content:0:80}}', not 'liveness check success'"
else
  mtime=$(stat -c %Y "$liveness_file" 2>/dev/null) || mtime=0
  age=$(( $(date +%s) - mtime ))
  if [ "$age" -gt {s.liveness_max_age_s} ]; then
    fail "openYuanrong worker {worker.address}: $liveness_file not rewritten for ${{age}}s (limit {s.liveness_max_age_s}s)"
  else
    pass "openYuanrong worker alive (liveness ${{age}}s old)"
  fi
fi
"""]
    if node == plan.etcd.node:
        url = f"{plan.etcd.client_url}/health"
        checks.append(f"""
# 2. etcd at the plan's client port.
body=$({curl} {q(url)} 2>&1) || true
case "$body" in
  *'"health":"true"'*) pass "etcd {plan.etcd.endpoint} healthy" ;;
  *) fail "etcd {url}: $(printf '%s' "${{body:-no answer}}" | tr -d '\\n' | head -c 120)" ;;
esac
""")
    if ranks:
        starts = "\n".join(
            f"{{ rc=0; {curl} -o /dev/null -w '%{{http_code}}' http://{r.address}:{r.port}/health 2>/dev/null || rc=$?; "
            f"echo \" $rc\"; }} > \"$tmp/{r.name}\" &" for r in ranks
        )
        verdicts = "\n".join(
            f"rank_verdict {r.name} http://{r.address}:{r.port}/health" for r in ranks
        )
        checks.append(f"""
# 3. /health of the {len(ranks)} vLLM rank(s) on this node, concurrently.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{starts}
wait
healthy=0
rank_verdict() {{  # rank_verdict NAME URL
  local result code rc
  result=$(cat "$tmp/$1" 2>/dev/null) || result="000 -1"
  code=${{result%% *}}
  rc=${{result##* }}
  if [ "$code" = 200 ]; then
    healthy=$((healthy + 1))
    return 0
  fi
  case "$rc" in
    7) fail "rank $1 $2: cannot connect (refused or unreachable)" ;;
    28) fail "rank $1 $2: no answer within {s.http_timeout_s}s" ;;
    0) fail "rank $1 $2: HTTP $code" ;;
    *) fail "rank $1 $2: curl exit $rc" ;;
  esac
}}
{verdicts}
if [ "$healthy" -eq {len(ranks)} ]; then pass "{len(ranks)}/{len(ranks)} ranks healthy"; fi
""")
    what = ["openYuanrong worker"] + (["etcd"] if node == plan.etcd.node else []) + (
        [f"{len(ranks)} vLLM rank(s)"] if ranks else [])
    return (
        _header(plan, node, f"liveness probe ({', '.join(what)})")
        + f"# Generated by ascend_pd.probes: exit 0 alive, 1 not; one line on stdout, appended to {d}/liveness.log.\n"
        + _verdict_lib(f"{d}/liveness.log", "liveness", node, s)
        + "".join(checks)
        + "\nfinish\n"
    )


def readiness_script(plan: Plan, settings: ProbeSettings = DEFAULT_SETTINGS) -> str:
    """The text of `readiness.sh` (proxy node): one chat completion through the PD proxy."""
    s = settings
    d = probe_dir(plan)
    p = plan.proxy
    node = p.node
    url = f"{p.url}/v1/chat/completions"
    request = json.dumps({
        "model": plan.cfg.model.served_name,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": READINESS_MAX_TOKENS, "temperature": 0, "stream": False,
        # Reasoning models: answer directly, so a few tokens give content.
        "chat_template_kwargs": {"enable_thinking": False},
    })
    py = plan.cfg.proxy.python
    return (
        _header(plan, node, f"readiness probe (chat completion through {p.url})")
        + f"# Generated by ascend_pd.probes: exit 0 ready, 1 not; one line on stdout, appended to {d}/readiness.log.\n"
        + _verdict_lib(f"{d}/readiness.log", "readiness", node, s)
        + f"""
request={q(request)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rc=0
timing=$(curl --noproxy '*' -sS --connect-timeout {s.connect_timeout_s} -m {s.readiness_timeout_s} -o "$tmp/body" \\
  -w '%{{http_code}} %{{time_total}}' -H 'Content-Type: application/json' -d "$request" \\
  {q(url)} 2>"$tmp/err") || rc=$?
code=${{timing%% *}}
seconds=${{timing##* }}
if [ "$rc" -eq 28 ]; then
  fail "chat completion via {url}: no answer within {s.readiness_timeout_s}s"
elif [ "$rc" -ne 0 ]; then
  fail "chat completion via {url}: $(tr -d '\\n' < "$tmp/err" | head -c 160)"
elif [ "$code" != 200 ]; then
  fail "chat completion via {url}: HTTP $code $(tr -d '\\n' < "$tmp/body" | head -c 160)"
elif text=$({q(py)} - "$tmp/body" 2>&1 <<'PY'
import json, sys
try:
    with open(sys.argv[1]) as f:
        answer = json.load(f)
    msg = answer["choices"][0]["message"]
except Exception as exc:
    with open(sys.argv[1], errors="replace") as f:
        sys.exit(f"no chat completion in the answer ({{exc!r}}): {{f.read(120)!r}}")
# Reasoning models may answer only in `reasoning` (vLLM >= 0.17) or `reasoning_content` (older).
text = msg.get("content") or msg.get("reasoning") or msg.get("reasoning_content") or ""
if not text.strip():
    sys.exit("the completion has no text: " + json.dumps(msg)[:120])
print(" ".join(text.split())[:40])
PY
); then
  pass "chat completion via {p.url} in ${{seconds}}s: '$text'"
else
  fail "chat completion via {url}: $text"
fi
finish
"""
    )


def _install(path: str, text: str) -> str:
    if PROBE_HEREDOC in text:
        raise ValueError(f"probe text contains the heredoc delimiter {PROBE_HEREDOC}")
    return (f"cat > {q(path + '.tmp')} <<'{PROBE_HEREDOC}'\n{text}{PROBE_HEREDOC}\n"
            f"chmod 755 {q(path + '.tmp')}\n"
            f"mv -f {q(path + '.tmp')} {q(path)}\n")


def probes(plan: Plan, node: str, *, settings: ProbeSettings = DEFAULT_SETTINGS) -> Script:
    """Install `liveness.sh` (every node) and `readiness.sh` (proxy node) under `<stateDir>/probes/`."""
    if node not in {n.name for n in plan.nodes}:
        raise ValueError(f"unknown node {node!r}; the plan has {[n.name for n in plan.nodes]}")
    d = probe_dir(plan)
    names = ["liveness.sh"]
    body = _install(f"{d}/liveness.sh", liveness_script(plan, node, settings))
    if node == plan.proxy.node:
        names.append("readiness.sh")
        body += _install(f"{d}/readiness.sh", readiness_script(plan, settings))
    else:
        body += f"rm -f {q(d + '/readiness.sh')}  # the proxy lives elsewhere\n"
    create = _header(plan, node, f"probes ({', '.join(names)})") + f"""mkdir -p {q(d)}
{body}echo "probes on {node}: {' '.join(f'{d}/{n}' for n in names)}"
"""
    delete = _header(plan, node, "probes (remove)") + f"""rm -rf {q(d)}
echo "probes on {node}: removed {d}"
"""
    return Script("probes", node, "container", create, delete)


__all__ = ["probes", "liveness_script", "readiness_script", "probe_dir", "ProbeSettings", "DEFAULT_SETTINGS"]
