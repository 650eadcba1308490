#!/usr/bin/env bash
# ascend-pd a2-8node: etcd 192.0.2.10:2379 on p0
set -euo pipefail

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
if needs_start /workspace/ascend-pd/run/etcd.pid 0a17f126867bcd3a 30; then
  rotate_log /workspace/ascend-pd/logs/etcd.log
  setsid nohup env \
      -u http_proxy -u https_proxy -u ftp_proxy -u all_proxy -u grpc_proxy -u HTTP_PROXY -u HTTPS_PROXY -u FTP_PROXY -u ALL_PROXY -u GOOGLE_LOGTOSTDERR -u GOOGLE_ALSOLOGTOSTDERR \
      etcd --name etcd-single \
      --data-dir /tmp/etcd-data \
      --listen-client-urls http://192.0.2.10:2379 \
      --advertise-client-urls http://192.0.2.10:2379 \
      --listen-peer-urls http://192.0.2.10:2380 \
      --initial-advertise-peer-urls http://192.0.2.10:2380 \
      --initial-cluster etcd-single=http://192.0.2.10:2380 \
      > /workspace/ascend-pd/logs/etcd.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/etcd.pid
  echo 0a17f126867bcd3a > /workspace/ascend-pd/run/etcd.spec
  echo "etcd: started pid $(cat /workspace/ascend-pd/run/etcd.pid)"
fi
deadline=$((SECONDS + 60))
until curl --noproxy '*' -fsS -m 3 http://192.0.2.10:2379/health 2>/dev/null | grep -q '"health":"true"'; do
  if ! alive "$(cat /workspace/ascend-pd/run/etcd.pid)"; then fail_with_log /workspace/ascend-pd/logs/etcd.log "etcd exited before it became healthy"; fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    stop_pidfiles 10 /workspace/ascend-pd/run/etcd.pid
    fail_with_log /workspace/ascend-pd/logs/etcd.log "etcd not healthy at http://192.0.2.10:2379/health within 60s"
  fi
  sleep 1
done
echo "etcd healthy at http://192.0.2.10:2379"
