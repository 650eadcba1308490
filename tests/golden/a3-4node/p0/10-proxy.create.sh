#!/usr/bin/env bash
# ascend-pd a3-4node: PD proxy http://192.0.2.30:8088 on p0
set -euo pipefail
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
stop_pidfiles() {  # stop_pidfiles GRACE PIDFILE...: TERM every process group at once, KILL what is left after GRACE s
  local grace=$1 pidfile pid deadline waiting
  shift
  local pids=()
  for pidfile in "$@"; do
    if [ -s "$pidfile" ] && alive "$(cat "$pidfile")"; then
      pid=$(cat "$pidfile")
      pids+=("$pid")
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    fi
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
  for pidfile in "$@"; do rm -f "$pidfile" "${pidfile%.pid}.spec"; done
}
needs_start() {  # needs_start PIDFILE SPEC GRACE: 0 if it must (re)start, 1 if running with SPEC
  local pidfile=$1 spec=$2 grace=$3
  if [ -s "$pidfile" ] && alive "$(cat "$pidfile")"; then
    if [ "$(cat "${pidfile%.pid}.spec" 2>/dev/null)" = "$spec" ]; then
      echo "$(basename "${pidfile%.pid}"): already running (pid $(cat "$pidfile"))"
      return 1
    fi
    echo "$(basename "${pidfile%.pid}"): running with an older command: restarting"
    stop_pidfiles "$grace" "$pidfile"
  fi
  return 0
}
rotate_log() {  # keep the previous run's log beside the new one
  if [ -f "$1" ]; then mv -f "$1" "$1.1"; fi
}
fail_with_log() {  # fail_with_log LOG MESSAGE
  echo "$2" >&2
  echo "--- last lines of $1:" >&2
  tail -n 50 "$1" >&2 2>/dev/null || echo "(no log)" >&2
  exit 1
}

mkdir -p /workspace/ascend-pd/run /workspace/ascend-pd/logs
if needs_start /workspace/ascend-pd/run/proxy.pid 0c2631d9a088579b 30; then
  rotate_log /workspace/ascend-pd/logs/proxy.log
  setsid nohup env \
      -u http_proxy -u https_proxy -u ftp_proxy -u all_proxy -u grpc_proxy -u HTTP_PROXY -u HTTPS_PROXY -u FTP_PROXY -u ALL_PROXY -u GOOGLE_LOGTOSTDERR -u GOOGLE_ALSOLOGTOSTDERR \
      python3 /vllm-workspace/vllm-ascend/examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py --host \
      192.0.2.30 \
      --port 8088 \
      --prefiller-hosts 192.0.2.30 \
      192.0.2.31 \
      --prefiller-ports 6700 \
      6700 \
      --decoder-hosts 192.0.2.40 \
      192.0.2.41 \
      --decoder-ports 6700 \
      6700 \
      > /workspace/ascend-pd/logs/proxy.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/proxy.pid
  echo 0c2631d9a088579b > /workspace/ascend-pd/run/proxy.spec
  echo "proxy: started pid $(cat /workspace/ascend-pd/run/proxy.pid)"
fi
# /healthcheck must report every planned instance: 2 prefill, 2 decode.
deadline=$((SECONDS + 300))
until curl --noproxy '*' -fsS -m 5 http://192.0.2.30:8088/healthcheck 2>/dev/null | python3 -c '
import json, sys
try:
    h = json.load(sys.stdin)
except ValueError:
    sys.exit(1)  # not listening yet: no body (quietly, this runs every 2 s)
sys.exit(0 if (h.get("prefill_instances"), h.get("decode_instances")) == (2, 2) else 1)'; do
  if ! alive "$(cat /workspace/ascend-pd/run/proxy.pid)"; then fail_with_log /workspace/ascend-pd/logs/proxy.log "the proxy exited before /healthcheck answered"; fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "last /healthcheck: $(curl --noproxy '*' -sS -m 5 http://192.0.2.30:8088/healthcheck 2>&1 || true)" >&2
    stop_pidfiles 10 /workspace/ascend-pd/run/proxy.pid
    fail_with_log /workspace/ascend-pd/logs/proxy.log "proxy /healthcheck did not report 2 prefill + 2 decode instances within 300s"
  fi
  sleep 2
done
# The seeds' functional check: one chat completion through the proxy must return text.
python3 - <<'SMOKE' || { stop_pidfiles 10 /workspace/ascend-pd/run/proxy.pid; fail_with_log /workspace/ascend-pd/logs/proxy.log "smoke completion through the proxy failed"; }
import json, sys, time, urllib.request
body = {"model": 'glm-5.1', "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 16, "temperature": 0, "stream": False,
        "chat_template_kwargs": {"enable_thinking": False}}
req = urllib.request.Request('http://192.0.2.30:8088/v1/chat/completions', data=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"})
t0 = time.monotonic()
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via http_proxy
try:
    with direct.open(req, timeout=600) as resp:
        answer = json.load(resp)
except Exception as exc:
    sys.exit(f"smoke completion failed: {exc}")
msg = answer["choices"][0]["message"]
# Reasoning models may answer only in `reasoning` (vLLM >= 0.17) or `reasoning_content` (older).
text = msg.get("content") or msg.get("reasoning") or msg.get("reasoning_content") or ""
if not text.strip():
    sys.exit(f"smoke completion returned no text: {json.dumps(answer)[:500]}")
print(f"smoke completion ok in {time.monotonic() - t0:.1f}s: {text.strip()[:60]!r}")
SMOKE
echo "proxy ready at http://192.0.2.30:8088 (2 prefill, 2 decode)"
