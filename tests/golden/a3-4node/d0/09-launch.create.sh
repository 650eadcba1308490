#!/usr/bin/env bash
# ascend-pd a3-4node: decode-0 ranks decode-0-r0 on d0
set -euo pipefail
node=d0
instance=decode-0
run_dir=/workspace/ascend-pd/run
log_dir=/workspace/ascend-pd/logs
grace=60
ready_timeout_s=3600
log_tail=50
planned=' decode-0-r0 '
etcd_url=http://192.0.2.30:2379
group_key=/ascend-pd/launch/a3-4node/decode-0/
local_pidfiles=(/workspace/ascend-pd/run/decode-0-r0.pid)
proxy_url=http://192.0.2.30:8088
proxy_type=decode
spares=0
retaint_s=5.0
proxy_patience_s=10
drain_quiet_polls=4
drain_timeout_s=300
slots=1
slot_ttl_s=7740
slot_timeout_s=7740
slot_prefix=/ascend-pd/rollout/a3-4node/decode/
failed_key=/ascend-pd/rollout/a3-4node/decode/failed
readd_timeout_s=60
lead=1
one_request='{"model": "glm-5.1", "prompt": "ping", "max_tokens": 1}'
first_rank=http://192.0.2.40:6700
endpoints=(192.0.2.40:6700 192.0.2.41:6700)
local_endpoints=(192.0.2.40:6700)
metrics_urls=(http://192.0.2.40:6700/metrics http://192.0.2.41:6700/metrics)
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
rollout_json() {  # rollout_json HOST:PORT...: the proxy's {"type", "instances"} body
  local out="" e
  for e in "$@"; do out="$out${out:+, }\"$e\""; done
  printf '{"type": "%s", "instances": [%s]}' "$proxy_type" "$out"
}

proxy_call() {  # proxy_call add|remove HOST:PORT...: POST to the proxy; its answer on stdout
  local mode=$1
  shift
  curl --noproxy '*' -fsS -m 5 -X POST "$proxy_url/instances/$mode" -H 'Content-Type: application/json' \
    -d "$(rollout_json "$@")" 2>/dev/null
}

proxy_call_patient() {  # proxy_call_patient add|remove HOST:PORT...: proxy_call, tried again for up to
  # proxy_patience_s while the proxy is there but does not answer in time (or answers an error): one
  # slow answer from a proxy busy with the cluster's traffic must not cost the drain. Nothing listening
  # (curl's 7) is a proxy that is gone, not slow: no wait.
  local until=$((SECONDS + proxy_patience_s)) rc
  while :; do
    proxy_call "$@" && return 0
    rc=$?
    if [ "$rc" = 7 ] || [ "$SECONDS" -ge "$until" ]; then return "$rc"; fi
    sleep 1
  done
}

keeper_pid=""
out_of_proxy() {  # out_of_proxy [serving]: take this node's ranks out of the proxy and keep them out;
  # 1 when the proxy does not answer. `serving`: the ranks serve and are about to stop, so the
  # role's only instance waits until the proxy has really dropped them.
  local deadline=$((SECONDS + drain_timeout_s)) stale
  local targets=("${local_endpoints[@]}")
  if [ "${1:-}" = serving ] && [ "$spares" = 0 ]; then
    # The role's only instance: whatever the proxy lists for the role is this instance, in its old
    # layout too (the ranks of a node that left the group, a dead one's): all of it goes, or the
    # role never counts 0 and this node restarts a drain timeout after the rest of its group.
    targets=("${endpoints[@]}")
    mapfile -t stale < <(role_listed)
    targets+=(${stale[@]+"${stale[@]}"})
  fi
  proxy_call_patient remove "${targets[@]}" >/dev/null || { echo "$instance: the proxy at $proxy_url does not answer: not draining through it"; return 1; }
  if [ "$spares" -gt 0 ]; then
    # Re-asserted until into_proxy (or the script's end): see the top of this file.
    (while sleep "$retaint_s"; do proxy_call remove "${local_endpoints[@]}" >/dev/null || true; done) </dev/null >/dev/null 2>&1 &
    keeper_pid=$!
    trap keep_out_stop EXIT
    echo "$instance: out of the proxy (the other $spares instance(s) of its role take its requests)"
    return 0
  fi
  if [ "${1:-}" != serving ]; then echo "$instance: out of the proxy"; return 0; fi
  # The role's only instance: a taint leaves its ranks the proxy's only choice, so requests keep
  # coming; only a removal stops them, which the proxy makes once no request is in flight anywhere.
  # So the group's lead node asks for all of its ranks at once, every retaint_s, and every node
  # waits until the proxy counts none of the role (a cheap /healthcheck, every 0.25 s; a removal
  # call costs the proxy a client per rank).
  local asked=$SECONDS
  until role_gone; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "$instance: the proxy still routes to it after ${drain_timeout_s}s (requests always in flight): restarting anyway;" >&2
      echo "  requests that reach the proxy while it restarts fail (an empty 200) or wait until it is back" >&2
      return 0
    fi
    sleep 0.25
    if [ "$lead" = 1 ] && ((SECONDS - asked >= ${retaint_s%.*})); then
      proxy_call remove "${targets[@]}" >/dev/null || true
      asked=$SECONDS
    fi
  done
  echo "$instance: out of the proxy (the only instance of its role: requests are refused until it is back)"
}

role_listed() {  # the HOST:PORT endpoints the proxy lists for this role now, one a line (none: no answer)
  local answer
  # A removal of no instance changes nothing and answers with the current lists.
  answer=$(proxy_call remove) || return 0
  printf '%s' "$answer" | grep -o "\"current_${proxy_type}_instances\": *\[[^]]*\]" | grep -o '"[^"]*:[0-9]*"' | tr -d '"' || true
}

role_gone() {  # 0 once the proxy's /healthcheck counts no instance of this role, or the proxy is gone
  local answer
  answer=$(curl --noproxy '*' -fsS -m 5 "$proxy_url/healthcheck" 2>/dev/null) || return 0  # routes nothing
  printf '%s' "$answer" | grep -q "\"${proxy_type}_instances\": *0[,}]"
}

keep_out_stop() {  # stop re-asserting the removal
  if [ -n "$keeper_pid" ]; then kill "$keeper_pid" 2>/dev/null || true; wait "$keeper_pid" 2>/dev/null || true; fi
  keeper_pid=""
}

busy() {  # the instance's running + waiting requests, summed over its ranks (an unreachable rank: 0)
  local url total=0 n
  for url in "${metrics_urls[@]}"; do
    n=$(curl --noproxy '*' -fsS -m 3 "$url" 2>/dev/null \
      | awk '/^vllm:num_requests_(running|waiting)[{ ]/ {s += $NF} END {printf "%d", s}') || n=0
    total=$((total + ${n:-0}))
  done
  echo "$total"
}

drain() {  # wait until the instance's ranks hold no request for drain_quiet_polls polls in a row, at most drain_timeout_s
  local deadline=$((SECONDS + drain_timeout_s)) n quiet=0
  # Several idle polls in a row: a request the proxy routed just before the taint may still be on
  # its way to a rank.
  while [ "$quiet" -lt "$drain_quiet_polls" ]; do
    n=$(busy)
    if [ "$n" -gt 0 ]; then quiet=0; else quiet=$((quiet + 1)); fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "$instance: $n request(s) still on its ranks after ${drain_timeout_s}s: stopping anyway" >&2
      return 0
    fi
    sleep 0.5
  done
  echo "$instance: drained"
}

into_proxy() {  # into_proxy HOST:PORT...: put ranks back into the proxy; 1 when it will not list them
  # The proxy adds an instance at once only when its /v1/models answers right then; otherwise it
  # parks it and looks again every --waiting-retry-interval (ascend-pd:proxy.flags), up to --max-waiting-retries
  # times, and requests meanwhile find the role short (none at all for its only instance). So the
  # add is repeated until the proxy's own answer lists every endpoint.
  keep_out_stop
  local deadline=$((SECONDS + readd_timeout_s)) answer listed ep missing
  while :; do
    answer=$(proxy_call add "$@") || answer=""
    if [ -z "$answer" ] && [ "$SECONDS" -ge "$deadline" ]; then
      # Whenever it answers again it starts from its argv, which lists every planned instance.
      echo "$instance: the proxy at $proxy_url does not answer: not adding $* to it"
      return 0
    fi
    listed=$(printf '%s' "$answer" | grep -o "\"current_${proxy_type}_instances\": *\[[^]]*\]") || listed=""
    missing=""
    for ep in "$@"; do case "$listed" in *"\"$ep\""*) ;; *) missing="$missing $ep" ;; esac; done
    if [ -n "$answer" ] && [ -z "$missing" ]; then
      echo "$instance: back in the proxy ($*)"
      return 0
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "$instance: the proxy at $proxy_url does not list${missing} after ${readd_timeout_s}s of /instances/add" >&2
      return 1
    fi
    sleep 1
  done
}

slot_b64() { printf '%s' "$1" | base64 | tr -d '\n'; }

etcd_post() {  # etcd_post PATH JSON: etcd's JSON gateway; the answer on stdout
  curl --noproxy '*' -fsS -m 5 -X POST "$etcd_url$1" -d "$2" 2>/dev/null
}

etcd_lease() {  # a new lease of slot_ttl_s seconds: its ID on stdout
  etcd_post /v3/lease/grant "{\"TTL\": $slot_ttl_s}" | grep -o '"ID":"[0-9]*"' | cut -d'"' -f4
}

etcd_value() {  # etcd_value KEY: the key's value on stdout; 1 when it is not set (or etcd does not answer)
  local v
  v=$(etcd_post /v3/kv/range "{\"key\": \"$(slot_b64 "$1")\"}" | grep -o '"value":"[^"]*"' | cut -d'"' -f4) || return 1
  [ -n "$v" ] && printf '%s' "$v" | base64 -d 2>/dev/null
}

etcd_revision() {  # etcd's current revision (every write raises it)
  etcd_post /v3/kv/range "{\"key\": \"$(slot_b64 "$failed_key")\"}" | grep -o '"revision":"[0-9]*"' | head -1 | cut -d'"' -f4
}

rollout_failed() {  # rollout_failed REVISION: the other instance whose restart failed since then, on stdout; 1 if none
  local answer rev who
  answer=$(etcd_post /v3/kv/range "{\"key\": \"$(slot_b64 "$failed_key")\"}") || return 1
  rev=$(printf '%s' "$answer" | grep -o '"mod_revision":"[0-9]*"' | cut -d'"' -f4) || return 1
  who=$(printf '%s' "$answer" | grep -o '"value":"[^"]*"' | cut -d'"' -f4 | base64 -d 2>/dev/null) || return 1
  [ -n "$who" ] && [ "$who" != "$instance" ] && [ "${rev:-0}" -gt "$1" ] && printf '%s' "$who"
}

rollout_failed_mark() {  # this instance's restart failed: the role's waiting restarts stop (for slot_ttl_s at most)
  local lease
  lease=$(etcd_lease) || return 0
  etcd_post /v3/kv/put "{\"key\": \"$(slot_b64 "$failed_key")\", \"value\": \"$(slot_b64 "$instance")\", \"lease\": \"$lease\"}" >/dev/null || true
}

rollout_served() {  # this instance serves again: its own failure mark no longer holds the role back
  if [ "$(etcd_value "$failed_key" 2>/dev/null)" = "$instance" ]; then
    etcd_post /v3/kv/deleterange "{\"key\": \"$(slot_b64 "$failed_key")\"}" >/dev/null || true
    echo "$instance: serves again after its failed restart: the other instances of its role may restart"
  fi
  return 0
}

slot_held() {  # find the slot this instance holds (taken by the delete of its old container): slot_key
  local k
  for ((k = 0; k < slots; k++)); do
    if [ "$(etcd_value "$slot_prefix$k" 2>/dev/null)" = "$instance" ]; then
      slot_key=$(slot_b64 "$slot_prefix$k")
      return 0
    fi
  done
  return 0
}

proxy_lists() {  # proxy_lists HOST:PORT...: 0 when the proxy answers and lists one of them (tainted or not)
  local answer listed ep
  # A removal of no instance changes nothing and answers with the current lists.
  answer=$(proxy_call_patient remove) || return 1
  listed=$(printf '%s' "$answer" | grep -o "\"current_${proxy_type}_instances\": *\[[^]]*\]") || return 1
  for ep in "$@"; do case "$listed" in *"\"$ep\""*) return 0 ;; esac; done
  return 1
}

slot_acquire() {  # slot_acquire restart|delete: hold one of the role's restart slots (shared by the nodes of this instance);
  # exit 1, touching nothing, when another instance's restart failed (and, for a delete, when no slot comes)
  local deadline=$((SECONDS + slot_timeout_s)) lease k key answer said="" who answered holder since
  lease=$(etcd_lease) || lease=""
  if [ -z "$lease" ]; then echo "$instance: etcd $etcd_url does not answer: restarting without a slot" >&2; return 0; fi
  # Only a failure during this wait stops it: after a failed step Pulumi starts no new one, so an
  # older mark is from an earlier run, which this one retries; the failed instance keeps its slot
  # until it serves again, so it comes back first and the others follow.
  since=$(etcd_revision) || since=0
  while :; do
    if who=$(rollout_failed "${since:-0}"); then
      echo "$instance: the restart of $who failed: not restarting $instance, which keeps serving;" >&2
      echo "  fix what failed on $who (its launch output says what) and run pulumi up again" >&2
      exit 1
    fi
    answered=""
    for ((k = 0; k < slots; k++)); do
      key=$(slot_b64 "$slot_prefix$k")
      answer=$(etcd_post /v3/kv/txn "{\"compare\": [{\"key\": \"$key\", \"target\": \"CREATE\", \"result\": \"EQUAL\", \"create_revision\": \"0\"}], \"success\": [{\"request_put\": {\"key\": \"$key\", \"value\": \"$(slot_b64 "$instance")\", \"lease\": \"$lease\"}}], \"failure\": [{\"request_range\": {\"key\": \"$key\"}}]}") || answer=""
      # Taken now, or already held by this instance (its other nodes took it).
      case "$answer" in *'"succeeded":true'*|*"\"value\":\"$(slot_b64 "$instance")\""*)
        slot_key=$key
        echo "$instance: restart slot $((k + 1)) of $slots"
        return 0 ;;
      esac
      if [ -n "$answer" ]; then answered=1; fi
    done
    if [ -z "$answered" ]; then  # etcd went away meanwhile (its own container is replaced too)
      echo "$instance: etcd $etcd_url no longer answers: restarting without a slot" >&2
      return 0
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      if [ "${1:-}" = delete ]; then
        echo "$instance: no restart slot free after ${slot_timeout_s}s: not stopping it (it keeps serving); run pulumi up again" >&2
        exit 1
      fi
      echo "$instance: no restart slot free after ${slot_timeout_s}s: restarting anyway" >&2
      return 0
    fi
    if [ -z "$said" ]; then
      holder=$(etcd_value "${slot_prefix}0" 2>/dev/null) || holder=""
      echo "$instance: waiting for one of $slots restart slot(s) of its role${holder:+ (held by $holder)}"
      said=1
    fi
    sleep 1
  done
}

slot_release() {  # give the slot back (its lease would expire anyway)
  if [ -n "${slot_key:-}" ]; then etcd_post /v3/kv/deleterange "{\"key\": \"$slot_key\"}" >/dev/null || true; fi
}
group_b64() { printf '%s' "$1" | base64 | tr -d '\n'; }

group_put() {  # group_put STATE MESSAGE: record this node's launch state (best effort)
  local value
  value=$(group_b64 "$1 $node $(date +%s) $2")
  curl --noproxy '*' -fsS -m 5 -X POST "$etcd_url/v3/kv/put" \
    -d "{\"key\": \"$(group_b64 "$group_key$node")\", \"value\": \"$value\"}" >/dev/null 2>&1 || true
}

group_failed_peer() {  # group_failed_peer SINCE: print "NODE MESSAGE" of a peer that failed since SINCE (epoch s)
  local end answer value state peer at message
  # The prefix range ends where the key's last character (/) is followed by 0.
  end=$(group_b64 "${group_key%/}0")
  answer=$(curl --noproxy '*' -fsS -m 5 -X POST "$etcd_url/v3/kv/range" \
    -d "{\"key\": \"$(group_b64 "$group_key")\", \"range_end\": \"$end\"}" 2>/dev/null) || return 1
  for value in $(printf '%s' "$answer" | grep -o '"value":"[A-Za-z0-9+/=]*"' | cut -d'"' -f4); do
    read -r state peer at message <<< "$(printf '%s' "$value" | base64 -d 2>/dev/null)" || continue
    if [ "$state" = failed ] && [ "$peer" != "$node" ] && [ "${at:-0}" -ge "$1" ]; then
      echo "$peer $message"
      return 0
    fi
  done
  return 1
}

mkdir -p "$run_dir" "$log_dir"
# A slot this instance holds from the delete in its old container, given back once it serves again.
slot_key=""
slot_held
# Ranks on this node that the plan no longer has, from any instance: they hold ports and NPUs.
unplanned=()
for pidfile in "$run_dir"/prefill-*-r*.pid "$run_dir"/decode-*-r*.pid; do
  [ -e "$pidfile" ] || continue
  case "$planned" in *" $(basename "$pidfile" .pid) "*) ;; *)
    echo "$(basename "$pidfile" .pid): no longer planned on $node: stopping it"
    unplanned+=("$pidfile") ;;
  esac
done
if [ "${#unplanned[@]}" -gt 0 ]; then stop_pidfiles "$grace" "${unplanned[@]}"; fi

# A DP group restarts as a whole: keep this node's ranks only while every rank of the group answers.
group_healthy() {
  local url
  for url in http://192.0.2.40:6700/health http://192.0.2.41:6700/health; do curl --noproxy '*' -fsS -o /dev/null -m 3 "$url" 2>/dev/null || return 1; done
}
running=0 changed=0 rollout=0
for pidfile in "${local_pidfiles[@]}"; do if pid_of "$pidfile" >/dev/null; then running=1; fi; done
running_with /workspace/ascend-pd/run/decode-0-r0.pid e8ceab95234145a9 || changed=1
if [ "$running" = 1 ] && ! group_healthy; then
  echo "$instance: not every rank of the group answers /health: restarting this node's ranks"
  if out_of_proxy; then rollout=1; fi  # broken: nothing to drain
  stop_pidfiles "$grace" "${local_pidfiles[@]}"
elif [ "$running" = 1 ] && [ "$changed" = 1 ]; then
  # A serving instance restarts: one slot of its role, out of the proxy, drained, then stopped.
  echo "$instance: its ranks' commands changed: restarting its ranks on $node"
  slot_acquire restart
  if out_of_proxy serving; then rollout=1; drain; fi
  stop_pidfiles "$grace" "${local_pidfiles[@]}"
elif [ "$running" = 0 ] && out_of_proxy; then
  rollout=1  # dead ranks the proxy still routes to: out until they answer again
fi
group_put starting launching
started_at=$(date +%s)


fail() {  # fail MESSAGE: stop this node's ranks, tell the group, exit 1
  echo "$instance on $node: $1" >&2
  group_put failed "$1"
  stop_pidfiles "$grace" "${local_pidfiles[@]}"
  # A serving instance that does not come back keeps its slot, and the role's other restarts
  # waiting for one stop: the instance stays out of the proxy (it does not serve) until it runs again.
  if [ -n "$slot_key" ]; then rollout_failed_mark; fi
  exit 1
}
check_rank() {  # check_rank NAME URL: 0 healthy, 1 not yet; a dead rank fails the launch
  if ! pid_of "$run_dir/$1.pid" >/dev/null; then
    show_log "$log_dir/$1.log"
    fail "$1 (pid $(cat "$run_dir/$1.pid" 2>/dev/null)) exited before answering /health"
  fi
  curl --noproxy '*' -fsS -o /dev/null -m 3 "$2" 2>/dev/null
}

# decode-0-r0: DP rank 0/2, devices 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15, port 6700
if needs_start /workspace/ascend-pd/run/decode-0-r0.pid e8ceab95234145a9 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r0.log
  setsid nohup env \
      -u http_proxy -u https_proxy -u ftp_proxy -u all_proxy -u grpc_proxy -u HTTP_PROXY -u HTTPS_PROXY -u FTP_PROXY -u ALL_PROXY -u GOOGLE_LOGTOSTDERR -u GOOGLE_ALSOLOGTOSTDERR \
      ACL_OP_INIT_MODE="1" \
      ASCEND_A3_ENABLE="1" \
      ASCEND_AGGREGATE_ENABLE="1" \
      ASCEND_TRANSPORT_PRINT="1" \
      HCCL_BUFFSIZE="256" \
      HCCL_OP_EXPANSION_MODE="AIV" \
      LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/usr/local/lib" \
      OMP_NUM_THREADS="10" \
      OMP_PROC_BIND="false" \
      PYTORCH_NPU_ALLOC_CONF="expandable_segments:True" \
      TASK_QUEUE_ENABLE="1" \
      VLLM_ASCEND_ENABLE_FUSED_MC2="1" \
      VLLM_ASCEND_ENABLE_MLAPO="1" \
      HCCL_IF_IP="192.0.2.40" \
      GLOO_SOCKET_IFNAME="enp3s0" \
      TP_SOCKET_IFNAME="enp3s0" \
      HCCL_SOCKET_IFNAME="enp3s0" \
      ASCEND_RT_VISIBLE_DEVICES="0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15" \
      DS_WORKER_ADDR="192.0.2.40:18481" \
      PYTHONHASHSEED="0" \
      VLLM_ENGINE_READY_TIMEOUT_S="3600" \
      vllm serve /data/GLM-5.1-w8a8 \
      --host 192.0.2.40 \
      --port 6700 \
      --data-parallel-size 2 \
      --data-parallel-rank 0 \
      --data-parallel-address 192.0.2.40 \
      --data-parallel-rpc-port 10521 \
      --tensor-parallel-size 16 \
      --served-model-name glm-5.1 \
      --additional-config '{"ascend_compilation_config": {"enable_npugraph_ex": true, "fuse_muls_add": true}, "multistream_overlap_shared_expert": true, "recompute_scheduler_enable": true}' \
      --async-scheduling \
      --compilation-config '{"cudagraph_capture_sizes": [4, 8, 12, 16, 20, 24, 28, 32], "cudagraph_mode": "FULL_DECODE_ONLY"}' \
      --enable-auto-tool-choice \
      --enable-expert-parallel \
      --gpu-memory-utilization 0.92 \
      --max-model-len 202752 \
      --max-num-batched-tokens 32 \
      --max-num-seqs 8 \
      --quantization ascend \
      --reasoning-parser glm45 \
      --seed 1024 \
      --speculative-config '{"method": "mtp", "num_speculative_tokens": 3}' \
      --tool-call-parser glm47 \
      --trust-remote-code \
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_consumer", "kv_port": "36200", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 16}, "decode": {"dp_size": 2, "tp_size": 16}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "0", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r0.log 2>&1 < /dev/null &
  started /workspace/ascend-pd/run/decode-0-r0.pid e8ceab95234145a9 $!
fi

# Wait until every local rank answers /health (the ranks of a DP group need all their peers up).
deadline=$((SECONDS + ready_timeout_s))
report=$((SECONDS + 60))
while :; do
  healthy=0
  check_rank decode-0-r0 http://192.0.2.40:6700/health && healthy=$((healthy + 1))
  if [ "$healthy" -eq 1 ]; then break; fi
  if peer=$(group_failed_peer "$started_at"); then
    fail "the launch on ${peer%% *} failed (${peer#* }): stopping here too"
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    for pidfile in "${local_pidfiles[@]}"; do show_log "$log_dir/$(basename "$pidfile" .pid).log"; done
    fail "only $healthy of 1 ranks healthy after ${ready_timeout_s}s"
  fi
  if [ "$SECONDS" -ge "$report" ]; then
    echo "$instance on $node: $healthy/1 ranks healthy after $SECONDS s"
    report=$((SECONDS + 60))
  fi
  sleep 5
done
group_put ready healthy
echo "$instance on $node: 1/1 ranks healthy"
if [ "$rollout" = 1 ]; then
  # One request on this node's first rank before the proxy sends it traffic again.
  if ! curl --noproxy '*' -fsS -o /dev/null -m 60 -H 'Content-Type: application/json' \
      -d "$one_request" "$first_rank/v1/completions"; then
    fail "no completion from $first_rank after the restart: left out of the proxy"
  fi
  if ! into_proxy "${local_endpoints[@]}"; then
    fail "not taken back by the proxy: left out of it (the next pulumi up, or heal, starts it again)"
  fi
fi
rollout_served
slot_release
