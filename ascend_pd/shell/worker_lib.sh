# shellcheck shell=bash disable=SC2154  # its parameters are set by the script that includes it
# Finding and stopping the openYuanrong worker (datasystem_worker, started by dscli).
#
# Parameters (set by the script before this library): worker_kill_grace_s, the TERM -> KILL grace
# after `dscli stop` gave up. Needs lib.sh (alive) before it.

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
