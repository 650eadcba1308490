#!/usr/bin/env bash
# ascend-pd a2-8node: openYuanrong worker 192.0.2.10:18481 (stop, clean) on p0
set -euo pipefail
address=192.0.2.10:18481
workdir=/workspace/ascend-pd/yuanrong
specfile=/workspace/ascend-pd/run/worker.spec
joinedfile=/workspace/ascend-pd/run/worker.etcd
liveness=/workspace/liveness
stop_timeout_s=120
worker_kill_grace_s=15
log_tail=50
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
worker_pids() {  # worker_pids ADDRESS: datasystem_worker processes serving exactly ADDRESS
  local d cmd argv
  for d in /proc/[0-9]*; do
    # A builtin read, no process per /proc entry (this runs in polling loops). 2>/dev/null first: a
    # process that exits mid-scan must not print "No such file" noise.
    mapfile -d '' -t argv 2>/dev/null < "$d/cmdline" || continue
    cmd="${argv[*]} "
    case "$cmd" in *datasystem_worker" "*) ;; *) continue ;; esac
    # dscli passes --worker_address=ADDR: matching the whole flag keeps 10.0.0.1:18481 from
    # matching 110.0.0.1:18481, and a shell whose command line holds this script from matching.
    case " $cmd" in *" --worker_address=$1 "*) echo "${d#/proc/}" ;; esac
  done
}

signal_worker() {  # signal_worker SIGNAL ADDRESS SECONDS: signal it, then wait up to SECONDS until it is gone
  # shellcheck disable=SC2046  # one word per pid
  signal_pids "$1" "$3" $(worker_pids "$2")
}

signal_pids() {  # signal_pids SIGNAL SECONDS PID...: signal each, then wait up to SECONDS until all are gone
  local sig=$1 deadline=$((SECONDS + $2)) pid
  shift 2
  for pid in "$@"; do kill "-$sig" "$pid" 2>/dev/null || true; done
  # By pid, not by command line: an exiting worker's cmdline reads empty once its memory is released,
  # while it still holds its sockets and files (seen: gone for worker_pids, still in /proc, state D).
  for pid in "$@"; do
    while alive "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.5; done
  done
}

stop_worker() {  # stop_worker ADDRESS STOP_TIMEOUT: dscli stop (bounded), TERM, KILL; 1 if it survives
  local pids pid left=""
  pids=$(worker_pids "$1")
  [ -n "$pids" ] || return 0
  # dscli stop's own wait is 180 s + shared memory / 40 s (hours at 500 GB): bound it.
  if ! timeout "$2" dscli stop --worker_address "$1"; then
    echo "dscli stop failed or did not finish within $2s: terminating the worker" >&2
  fi
  # shellcheck disable=SC2086  # one word per pid
  signal_pids TERM "$worker_kill_grace_s" $pids
  # KILL is asynchronous: the worker holds its port and files until it is gone.
  # shellcheck disable=SC2086
  signal_pids KILL 10 $pids
  for pid in $pids $(worker_pids "$1"); do if alive "$pid"; then left="$left $pid"; fi; done
  if [ -n "$left" ]; then
    echo "worker $1 (pid$left) survived KILL" >&2
    return 1
  fi
}

registered() {  # registered ETCD_URL ADDRESS: 0 if etcd holds the worker's registration key
  local key
  # etcd's JSON gateway takes base64 keys; a registration is /datasystem/cluster/<host:port>.
  key=$(printf '/datasystem/cluster/%s' "$2" | base64 | tr -d '\n')
  curl --noproxy '*' -fsS -m 5 -X POST "$1/v3/kv/range" -d "{\"key\": \"$key\"}" 2>/dev/null \
    | grep -q '"count"'
}

cd "$workdir" 2>/dev/null || true
# Its files go only once it is gone (stop_worker fails the delete otherwise).
stop_worker "$address" "$stop_timeout_s"
# Stale rocksdb metadata and client logs cause 'key not found' after an unclean stop (seed FAQ).
rm -rf "$workdir/datasystem" "$HOME/.datasystem" "$liveness" "$specfile" "$joinedfile"
echo "worker $address: stopped and cleaned"
