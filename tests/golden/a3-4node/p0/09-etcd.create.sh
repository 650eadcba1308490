#!/usr/bin/env bash
# ascend-pd a3-4node: etcd 192.0.2.30:2379 on p0
set -euo pipefail
run_dir=/workspace/ascend-pd/run
log_dir=/workspace/ascend-pd/logs
pidfile=/workspace/ascend-pd/run/etcd.pid
log=/workspace/ascend-pd/logs/etcd.log
data_dir=/tmp/etcd-data
client_url=http://192.0.2.30:2379
start_timeout_s=60
log_tail=50
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

mkdir -p "$run_dir" "$log_dir"
if ! running_with "$pidfile" d3bd7c74c84b5f41; then
  # A fresh start: the member data of an earlier run must not come back (seed 000's FAQ).
  stop_pidfiles 30 "$pidfile"
  rm -rf "$data_dir"
  # Another etcd on these ports (not this script's) would answer the health check below for it.
  if curl --noproxy '*' -fsS -m 3 "$client_url/health" 2>/dev/null | grep -q '"health":"true"'; then
    echo "an etcd this script did not start already answers at $client_url: stop it (an earlier" >&2
    echo "ascend-pd:etcd.image container, or a system etcd) so the planned one can bind its ports" >&2
    exit 1
  fi
fi
if ! command -v etcd > /dev/null 2>&1; then
  echo 'etcd binary etcd is missing on p0: set ascend-pd:etcd.binary to the etcd in the container' >&2
  exit 1
fi
if needs_start /workspace/ascend-pd/run/etcd.pid d3bd7c74c84b5f41 30; then
  rotate_log /workspace/ascend-pd/logs/etcd.log
  setsid nohup env \
      -u http_proxy -u https_proxy -u ftp_proxy -u all_proxy -u grpc_proxy -u HTTP_PROXY -u HTTPS_PROXY -u FTP_PROXY -u ALL_PROXY -u GOOGLE_LOGTOSTDERR -u GOOGLE_ALSOLOGTOSTDERR \
      etcd \
      --name etcd-single \
      --data-dir /tmp/etcd-data \
      --listen-client-urls http://192.0.2.30:2379 \
      --advertise-client-urls http://192.0.2.30:2379 \
      --listen-peer-urls http://127.0.0.1:2380 \
      --initial-advertise-peer-urls http://127.0.0.1:2380 \
      --initial-cluster etcd-single=http://127.0.0.1:2380 \
      > /workspace/ascend-pd/logs/etcd.log 2>&1 < /dev/null &
  started /workspace/ascend-pd/run/etcd.pid d3bd7c74c84b5f41 $!
fi
deadline=$((SECONDS + start_timeout_s))
until curl --noproxy '*' -fsS -m 3 "$client_url/health" 2>/dev/null | grep -q '"health":"true"' && pid_of "$pidfile" >/dev/null; do
  if ! pid_of "$pidfile" >/dev/null; then fail_with_log "$log" "etcd exited before it became healthy"; fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    stop_pidfiles 10 "$pidfile"
    fail_with_log "$log" "etcd not healthy at $client_url/health within ${start_timeout_s}s"
  fi
  sleep 1
done
echo "etcd healthy at $client_url"
