#!/usr/bin/env bash
# ascend-pd a2-8node: openYuanrong worker 192.0.2.23:18481 on d3
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

worker_pids() {  # worker_pids ADDRESS: datasystem_worker processes serving exactly ADDRESS
  local d cmd
  for d in /proc/[0-9]*; do
    # 2>/dev/null first: a process that exits mid-scan must not print "No such file" noise.
    cmd=$(tr '\0' ' ' 2>/dev/null < "$d/cmdline") || continue
    case "$cmd" in *datasystem_worker" "*) ;; *) continue ;; esac
    # dscli passes --worker_address=ADDR: matching the whole flag keeps 10.0.0.1:18481 from
    # matching 110.0.0.1:18481, and a shell whose command line holds this script from matching.
    case " $cmd" in *" --worker_address=$1 "*) echo "${d#/proc/}" ;; esac
  done
}
signal_worker() {  # signal_worker SIGNAL ADDRESS SECONDS: signal it, then wait up to SECONDS for it to exit
  local deadline=$((SECONDS + $3)) pid
  for pid in $(worker_pids "$2"); do kill "-$1" "$pid" 2>/dev/null || true; done
  while [ -n "$(worker_pids "$2")" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 1; done
}
stop_worker() {  # stop_worker ADDRESS STOP_TIMEOUT: dscli stop (bounded), TERM, KILL; 1 if it survives
  [ -n "$(worker_pids "$1")" ] || return 0
  # dscli stop's own wait is 180 s + shared memory / 40 s (hours at 500 GB): bound it.
  if ! timeout "$2" dscli stop --worker_address "$1"; then
    echo "dscli stop failed or did not finish within $2s: terminating the worker" >&2
  fi
  signal_worker TERM "$1" 15
  # KILL is asynchronous: the worker holds its port and files until it is gone.
  signal_worker KILL "$1" 10
  if [ -n "$(worker_pids "$1")" ]; then
    echo "worker $1 (pid $(worker_pids "$1" | tr '\n' ' ')) survived KILL" >&2
    return 1
  fi
}

mkdir -p /workspace/ascend-pd/run /workspace/ascend-pd/logs /workspace/ascend-pd/yuanrong
if [ -n "$(worker_pids 192.0.2.23:18481)" ]; then
  if [ "$(cat /workspace/ascend-pd/run/worker.spec 2>/dev/null)" = 8aefb852f1bfc279 ]; then
    echo "worker 192.0.2.23:18481: already running (pid $(worker_pids 192.0.2.23:18481 | tr '\n' ' '))"
    exit 0
  fi
  echo "worker 192.0.2.23:18481: running with older flags: restarting"
  stop_worker 192.0.2.23:18481 120
fi
# dscli resolves ./datasystem (logs, rocksdb, uds) against the current directory: always the same one.
cd /workspace/ascend-pd/yuanrong
rm -f /workspace/liveness
# dscli start returns once the worker is ready and kills it itself after -t seconds. stdin from
# /dev/null: the worker inherits it and must not hold (or read) the pipe this script arrives on.
attempt=1
until timeout 660 env -u http_proxy -u https_proxy -u ftp_proxy -u all_proxy -u grpc_proxy -u HTTP_PROXY -u HTTPS_PROXY -u FTP_PROXY -u ALL_PROXY -u GOOGLE_LOGTOSTDERR -u GOOGLE_ALSOLOGTOSTDERR dscli start -t 600 -w \
  --worker_address 192.0.2.23:18481 \
  --etcd_address 192.0.2.10:2379 \
  --shared_memory_size_mb 512000 \
  --node_timeout_s 300 \
  --node_dead_timeout_s 600 \
  --liveness_check_path /workspace/liveness \
  --arena_per_tenant 1 \
  --enable_huge_tlb true > /workspace/ascend-pd/logs/dscli-start.log 2>&1 < /dev/null; do
  signal_worker KILL 192.0.2.23:18481 15
  # Killed by a signal while starting (dscli: "exited with code -9"): right after a restart the
  # worker's own etcd thread can SIGKILL it as it rejoins the pool (seen in 2 of ~135 restarts on
  # a loaded machine). A fresh start succeeds; anything else (a bad flag, a timeout) fails again.
  if [ "$attempt" -lt 3 ] && grep -qs 'Worker exited with code -[0-9]' /workspace/ascend-pd/logs/dscli-start.log; then
    echo "worker 192.0.2.23:18481: killed while starting (attempt $attempt of 3): starting again"
    mv -f /workspace/ascend-pd/logs/dscli-start.log /workspace/ascend-pd/logs/dscli-start.log.$attempt
    attempt=$((attempt + 1))
    sleep 5
    continue
  fi
  {
    echo "openYuanrong worker 192.0.2.23:18481 failed to start (dscli start -t 600, attempt $attempt of 3)"
    echo "--- dscli start (/workspace/ascend-pd/logs/dscli-start.log):"
    grep -vF '[INFO] Starting with numactl command:' /workspace/ascend-pd/logs/dscli-start.log | tail -n 50 || true
    echo "--- last warnings and errors of /workspace/ascend-pd/yuanrong/datasystem/logs/datasystem_worker.INFO.log:"
    grep -s ' | [WEF] | ' /workspace/ascend-pd/yuanrong/datasystem/logs/datasystem_worker.INFO.log | tail -n 50 || true
  } >&2
  exit 1
done
deadline=$((SECONDS + 30))
until grep -qs 'liveness check success' /workspace/liveness; do
  if [ "$SECONDS" -ge "$deadline" ]; then fail_with_log /workspace/ascend-pd/logs/dscli-start.log "worker 192.0.2.23:18481 never wrote a successful /workspace/liveness"; fi
  sleep 1
done
# The liveness file outlives its writer: only a worker still running counts as started.
if [ -z "$(worker_pids 192.0.2.23:18481)" ]; then
  fail_with_log /workspace/ascend-pd/yuanrong/datasystem/logs/datasystem_worker.INFO.log "worker 192.0.2.23:18481 exited right after it became ready"
fi
echo 8aefb852f1bfc279 > /workspace/ascend-pd/run/worker.spec
echo "worker 192.0.2.23:18481: ready, registered with etcd 192.0.2.10:2379"
