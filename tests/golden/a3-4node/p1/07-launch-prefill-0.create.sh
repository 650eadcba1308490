#!/usr/bin/env bash
# ascend-pd a3-4node: prefill-0 ranks prefill-0-r1 on p1
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
# Ranks of prefill-0 on this node that the plan no longer has (dp or layout changed): stop them.
unplanned=()
for pidfile in /workspace/ascend-pd/run/prefill-0-r*.pid; do
  [ -e "$pidfile" ] || continue
  case "$(basename "$pidfile" .pid)" in prefill-0-r1) ;; *) echo "stopping $(basename "$pidfile" .pid): no longer planned"; unplanned+=("$pidfile") ;; esac
done
if [ "${#unplanned[@]}" -gt 0 ]; then stop_pidfiles 60 "${unplanned[@]}"; fi
stop_local_ranks() {
stop_pidfiles 60 /workspace/ascend-pd/run/prefill-0-r1.pid
}
show_log() {
  echo "--- last lines of /workspace/ascend-pd/logs/$1.log:" >&2
  tail -n 50 "/workspace/ascend-pd/logs/$1.log" >&2 || true
}
check_rank() {  # check_rank NAME URL: 0 healthy, 1 not yet; a dead rank fails the whole launch
  local pid
  pid=$(cat "/workspace/ascend-pd/run/$1.pid")
  if ! alive "$pid"; then
    echo "$1 (pid $pid) exited before answering /health" >&2
    show_log "$1"
    stop_local_ranks
    exit 1
  fi
  curl --noproxy '*' -fsS -o /dev/null -m 3 "$2" 2>/dev/null
}

# prefill-0-r1: DP rank 1/2, devices 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15, port 6700
if needs_start /workspace/ascend-pd/run/prefill-0-r1.pid e2992071fc2a6d4d 60; then
  rotate_log /workspace/ascend-pd/logs/prefill-0-r1.log
  setsid nohup env \
      -u http_proxy -u https_proxy -u ftp_proxy -u all_proxy -u grpc_proxy -u HTTP_PROXY -u HTTPS_PROXY -u FTP_PROXY -u ALL_PROXY -u GOOGLE_LOGTOSTDERR -u GOOGLE_ALSOLOGTOSTDERR \
      VLLM_ASCEND_ENABLE_FUSED_MC2="1" \
      HCCL_OP_EXPANSION_MODE="AIV" \
      OMP_PROC_BIND="false" \
      OMP_NUM_THREADS="10" \
      PYTORCH_NPU_ALLOC_CONF="expandable_segments:True" \
      HCCL_BUFFSIZE="256" \
      ASCEND_AGGREGATE_ENABLE="1" \
      ACL_OP_INIT_MODE="1" \
      ASCEND_A3_ENABLE="1" \
      VLLM_NIXL_ABORT_REQUEST_TIMEOUT="300000" \
      LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/usr/local/lib" \
      VLLM_ASCEND_ENABLE_FLASHCOMM1="1" \
      HCCL_IF_IP="192.0.2.31" \
      GLOO_SOCKET_IFNAME="enp3s0" \
      TP_SOCKET_IFNAME="enp3s0" \
      HCCL_SOCKET_IFNAME="enp3s0" \
      ASCEND_RT_VISIBLE_DEVICES="0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15" \
      DS_WORKER_ADDR="192.0.2.31:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /data/GLM-5.1-w8a8 \
      --host 192.0.2.31 \
      --port 6700 \
      --data-parallel-size 2 \
      --data-parallel-rank 1 \
      --data-parallel-address 192.0.2.30 \
      --data-parallel-rpc-port 10521 \
      --tensor-parallel-size 16 \
      --served-model-name glm-5.1 \
      --enable-expert-parallel \
      --speculative-config '{"num_speculative_tokens": 3, "method": "deepseek_mtp"}' \
      --seed 1024 \
      --max-model-len 202752 \
      --additional-config '{"enable_npugraph_ex": true, "fuse_muls_add": true, "multistream_overlap_shared_expert": true, "recompute_scheduler_enable": true}' \
      --trust-remote-code \
      --quantization ascend \
      --enable-auto-tool-choice \
      --tool-call-parser glm47 \
      --reasoning-parser glm45 \
      --max-num-batched-tokens 4096 \
      --max-num-seqs 64 \
      --gpu-memory-utilization 0.95 \
      --enforce-eager \
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_producer", "engine_id": "0", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer", "kv_port": "36000", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 16}, "decode": {"dp_size": 2, "tp_size": 16}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_producer", "kv_connector_extra_config": {"lookup_rpc_port": "0", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/prefill-0-r1.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/prefill-0-r1.pid
  echo e2992071fc2a6d4d > /workspace/ascend-pd/run/prefill-0-r1.spec
  echo "prefill-0-r1: started pid $(cat /workspace/ascend-pd/run/prefill-0-r1.pid)"
fi

# Wait until every local rank answers /health (ranks of a multi-node instance need their peers up).
deadline=$((SECONDS + 3600))
report=$((SECONDS + 60))
while :; do
  healthy=0
  check_rank prefill-0-r1 http://192.0.2.31:6700/health && healthy=$((healthy + 1))
  if [ "$healthy" -eq 1 ]; then break; fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "prefill-0 on p1: only $healthy of 1 ranks healthy after 3600s" >&2
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.31:6700/health 2>/dev/null || show_log prefill-0-r1
    stop_local_ranks
    exit 1
  fi
  if [ "$SECONDS" -ge "$report" ]; then
    echo "prefill-0 on p1: $healthy/1 ranks healthy after $SECONDS s"
    report=$((SECONDS + 60))
  fi
  sleep 5
done
echo "prefill-0 on p1: 1/1 ranks healthy"
