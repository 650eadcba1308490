#!/usr/bin/env bash
# ascend-pd a2-8node: decode-0 ranks decode-0-r0, decode-0-r1, decode-0-r2, decode-0-r3, decode-0-r4, decode-0-r5, decode-0-r6, decode-0-r7 on d0
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
# Ranks of decode-0 on this node that the plan no longer has (dp or layout changed): stop them.
unplanned=()
for pidfile in /workspace/ascend-pd/run/decode-0-r*.pid; do
  [ -e "$pidfile" ] || continue
  case "$(basename "$pidfile" .pid)" in decode-0-r0|decode-0-r1|decode-0-r2|decode-0-r3|decode-0-r4|decode-0-r5|decode-0-r6|decode-0-r7) ;; *) echo "stopping $(basename "$pidfile" .pid): no longer planned"; unplanned+=("$pidfile") ;; esac
done
if [ "${#unplanned[@]}" -gt 0 ]; then stop_pidfiles 60 "${unplanned[@]}"; fi
stop_local_ranks() {
stop_pidfiles 60 /workspace/ascend-pd/run/decode-0-r0.pid /workspace/ascend-pd/run/decode-0-r1.pid /workspace/ascend-pd/run/decode-0-r2.pid /workspace/ascend-pd/run/decode-0-r3.pid /workspace/ascend-pd/run/decode-0-r4.pid /workspace/ascend-pd/run/decode-0-r5.pid /workspace/ascend-pd/run/decode-0-r6.pid /workspace/ascend-pd/run/decode-0-r7.pid
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

# decode-0-r0: DP rank 0/32, devices 0, port 7100
if needs_start /workspace/ascend-pd/run/decode-0-r0.pid 1d72898ff433c3a1 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r0.log
  setsid nohup env \
      -u http_proxy -u https_proxy -u ftp_proxy -u all_proxy -u grpc_proxy -u HTTP_PROXY -u HTTPS_PROXY -u FTP_PROXY -u ALL_PROXY -u GOOGLE_LOGTOSTDERR -u GOOGLE_ALSOLOGTOSTDERR \
      LD_PRELOAD="/usr/lib/aarch64-linux-gnu/libjemalloc.so.2:${LD_PRELOAD:-}" \
      HCCL_OP_EXPANSION_MODE="AIV" \
      TASK_QUEUE_ENABLE="1" \
      VLLM_RPC_TIMEOUT="3600000" \
      VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS="30000" \
      HCCL_EXEC_TIMEOUT="204" \
      HCCL_CONNECT_TIMEOUT="1200" \
      OMP_PROC_BIND="false" \
      OMP_NUM_THREADS="10" \
      PYTORCH_NPU_ALLOC_CONF="expandable_segments:True" \
      HCCL_BUFFSIZE="1024" \
      VLLM_ASCEND_APPLY_DSV4_PATCH="1" \
      HCCL_IF_IP="192.0.2.20" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="0" \
      DS_WORKER_ADDR="192.0.2.20:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.20 \
      --port 7100 \
      --data-parallel-size 32 \
      --data-parallel-rank 0 \
      --data-parallel-address 192.0.2.20 \
      --data-parallel-rpc-port 12321 \
      --tensor-parallel-size 1 \
      --served-model-name deepseek_v4 \
      --enable-expert-parallel \
      --seed 1024 \
      --max-model-len 1048576 \
      --block-size 128 \
      --async-scheduling \
      --no-disable-hybrid-kv-cache-manager \
      --trust-remote-code \
      --gpu-memory-utilization 0.9 \
      --quantization ascend \
      --safetensors-load-strategy prefetch \
      --model-loader-extra-config '{"enable_multithread_load": "true", "num_threads": 128}' \
      --tokenizer-mode deepseek_v4 \
      --tool-call-parser deepseek_v4 \
      --enable-auto-tool-choice \
      --reasoning-parser deepseek_v4 \
      --speculative-config '{"num_speculative_tokens": 1, "method": "mtp", "enforce_eager": true}' \
      --max-num-batched-tokens 60 \
      --max-num-seqs 30 \
      --no-enable-prefix-caching \
      --compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY"}' \
      --additional-config '{"ascend_compilation_config": {"enable_npugraph_ex": true, "enable_static_kernel": false}, "enable_cpu_binding": true, "multistream_overlap_shared_expert": true, "recompute_scheduler_enable": true}' \
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "0", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r0.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r0.pid
  echo 1d72898ff433c3a1 > /workspace/ascend-pd/run/decode-0-r0.spec
  echo "decode-0-r0: started pid $(cat /workspace/ascend-pd/run/decode-0-r0.pid)"
fi
# decode-0-r1: DP rank 1/32, devices 1, port 7101
if needs_start /workspace/ascend-pd/run/decode-0-r1.pid e05cfafe28ec3b92 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r1.log
  setsid nohup env \
      -u http_proxy -u https_proxy -u ftp_proxy -u all_proxy -u grpc_proxy -u HTTP_PROXY -u HTTPS_PROXY -u FTP_PROXY -u ALL_PROXY -u GOOGLE_LOGTOSTDERR -u GOOGLE_ALSOLOGTOSTDERR \
      LD_PRELOAD="/usr/lib/aarch64-linux-gnu/libjemalloc.so.2:${LD_PRELOAD:-}" \
      HCCL_OP_EXPANSION_MODE="AIV" \
      TASK_QUEUE_ENABLE="1" \
      VLLM_RPC_TIMEOUT="3600000" \
      VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS="30000" \
      HCCL_EXEC_TIMEOUT="204" \
      HCCL_CONNECT_TIMEOUT="1200" \
      OMP_PROC_BIND="false" \
      OMP_NUM_THREADS="10" \
      PYTORCH_NPU_ALLOC_CONF="expandable_segments:True" \
      HCCL_BUFFSIZE="1024" \
      VLLM_ASCEND_APPLY_DSV4_PATCH="1" \
      HCCL_IF_IP="192.0.2.20" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="1" \
      DS_WORKER_ADDR="192.0.2.20:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.20 \
      --port 7101 \
      --data-parallel-size 32 \
      --data-parallel-rank 1 \
      --data-parallel-address 192.0.2.20 \
      --data-parallel-rpc-port 12321 \
      --tensor-parallel-size 1 \
      --served-model-name deepseek_v4 \
      --enable-expert-parallel \
      --seed 1024 \
      --max-model-len 1048576 \
      --block-size 128 \
      --async-scheduling \
      --no-disable-hybrid-kv-cache-manager \
      --trust-remote-code \
      --gpu-memory-utilization 0.9 \
      --quantization ascend \
      --safetensors-load-strategy prefetch \
      --model-loader-extra-config '{"enable_multithread_load": "true", "num_threads": 128}' \
      --tokenizer-mode deepseek_v4 \
      --tool-call-parser deepseek_v4 \
      --enable-auto-tool-choice \
      --reasoning-parser deepseek_v4 \
      --speculative-config '{"num_speculative_tokens": 1, "method": "mtp", "enforce_eager": true}' \
      --max-num-batched-tokens 60 \
      --max-num-seqs 30 \
      --no-enable-prefix-caching \
      --compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY"}' \
      --additional-config '{"ascend_compilation_config": {"enable_npugraph_ex": true, "enable_static_kernel": false}, "enable_cpu_binding": true, "multistream_overlap_shared_expert": true, "recompute_scheduler_enable": true}' \
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "1", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r1.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r1.pid
  echo e05cfafe28ec3b92 > /workspace/ascend-pd/run/decode-0-r1.spec
  echo "decode-0-r1: started pid $(cat /workspace/ascend-pd/run/decode-0-r1.pid)"
fi
# decode-0-r2: DP rank 2/32, devices 2, port 7102
if needs_start /workspace/ascend-pd/run/decode-0-r2.pid 8778a9feca768bf5 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r2.log
  setsid nohup env \
      -u http_proxy -u https_proxy -u ftp_proxy -u all_proxy -u grpc_proxy -u HTTP_PROXY -u HTTPS_PROXY -u FTP_PROXY -u ALL_PROXY -u GOOGLE_LOGTOSTDERR -u GOOGLE_ALSOLOGTOSTDERR \
      LD_PRELOAD="/usr/lib/aarch64-linux-gnu/libjemalloc.so.2:${LD_PRELOAD:-}" \
      HCCL_OP_EXPANSION_MODE="AIV" \
      TASK_QUEUE_ENABLE="1" \
      VLLM_RPC_TIMEOUT="3600000" \
      VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS="30000" \
      HCCL_EXEC_TIMEOUT="204" \
      HCCL_CONNECT_TIMEOUT="1200" \
      OMP_PROC_BIND="false" \
      OMP_NUM_THREADS="10" \
      PYTORCH_NPU_ALLOC_CONF="expandable_segments:True" \
      HCCL_BUFFSIZE="1024" \
      VLLM_ASCEND_APPLY_DSV4_PATCH="1" \
      HCCL_IF_IP="192.0.2.20" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="2" \
      DS_WORKER_ADDR="192.0.2.20:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.20 \
      --port 7102 \
      --data-parallel-size 32 \
      --data-parallel-rank 2 \
      --data-parallel-address 192.0.2.20 \
      --data-parallel-rpc-port 12321 \
      --tensor-parallel-size 1 \
      --served-model-name deepseek_v4 \
      --enable-expert-parallel \
      --seed 1024 \
      --max-model-len 1048576 \
      --block-size 128 \
      --async-scheduling \
      --no-disable-hybrid-kv-cache-manager \
      --trust-remote-code \
      --gpu-memory-utilization 0.9 \
      --quantization ascend \
      --safetensors-load-strategy prefetch \
      --model-loader-extra-config '{"enable_multithread_load": "true", "num_threads": 128}' \
      --tokenizer-mode deepseek_v4 \
      --tool-call-parser deepseek_v4 \
      --enable-auto-tool-choice \
      --reasoning-parser deepseek_v4 \
      --speculative-config '{"num_speculative_tokens": 1, "method": "mtp", "enforce_eager": true}' \
      --max-num-batched-tokens 60 \
      --max-num-seqs 30 \
      --no-enable-prefix-caching \
      --compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY"}' \
      --additional-config '{"ascend_compilation_config": {"enable_npugraph_ex": true, "enable_static_kernel": false}, "enable_cpu_binding": true, "multistream_overlap_shared_expert": true, "recompute_scheduler_enable": true}' \
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "2", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r2.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r2.pid
  echo 8778a9feca768bf5 > /workspace/ascend-pd/run/decode-0-r2.spec
  echo "decode-0-r2: started pid $(cat /workspace/ascend-pd/run/decode-0-r2.pid)"
fi
# decode-0-r3: DP rank 3/32, devices 3, port 7103
if needs_start /workspace/ascend-pd/run/decode-0-r3.pid 5a8e16d89a509011 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r3.log
  setsid nohup env \
      -u http_proxy -u https_proxy -u ftp_proxy -u all_proxy -u grpc_proxy -u HTTP_PROXY -u HTTPS_PROXY -u FTP_PROXY -u ALL_PROXY -u GOOGLE_LOGTOSTDERR -u GOOGLE_ALSOLOGTOSTDERR \
      LD_PRELOAD="/usr/lib/aarch64-linux-gnu/libjemalloc.so.2:${LD_PRELOAD:-}" \
      HCCL_OP_EXPANSION_MODE="AIV" \
      TASK_QUEUE_ENABLE="1" \
      VLLM_RPC_TIMEOUT="3600000" \
      VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS="30000" \
      HCCL_EXEC_TIMEOUT="204" \
      HCCL_CONNECT_TIMEOUT="1200" \
      OMP_PROC_BIND="false" \
      OMP_NUM_THREADS="10" \
      PYTORCH_NPU_ALLOC_CONF="expandable_segments:True" \
      HCCL_BUFFSIZE="1024" \
      VLLM_ASCEND_APPLY_DSV4_PATCH="1" \
      HCCL_IF_IP="192.0.2.20" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="3" \
      DS_WORKER_ADDR="192.0.2.20:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.20 \
      --port 7103 \
      --data-parallel-size 32 \
      --data-parallel-rank 3 \
      --data-parallel-address 192.0.2.20 \
      --data-parallel-rpc-port 12321 \
      --tensor-parallel-size 1 \
      --served-model-name deepseek_v4 \
      --enable-expert-parallel \
      --seed 1024 \
      --max-model-len 1048576 \
      --block-size 128 \
      --async-scheduling \
      --no-disable-hybrid-kv-cache-manager \
      --trust-remote-code \
      --gpu-memory-utilization 0.9 \
      --quantization ascend \
      --safetensors-load-strategy prefetch \
      --model-loader-extra-config '{"enable_multithread_load": "true", "num_threads": 128}' \
      --tokenizer-mode deepseek_v4 \
      --tool-call-parser deepseek_v4 \
      --enable-auto-tool-choice \
      --reasoning-parser deepseek_v4 \
      --speculative-config '{"num_speculative_tokens": 1, "method": "mtp", "enforce_eager": true}' \
      --max-num-batched-tokens 60 \
      --max-num-seqs 30 \
      --no-enable-prefix-caching \
      --compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY"}' \
      --additional-config '{"ascend_compilation_config": {"enable_npugraph_ex": true, "enable_static_kernel": false}, "enable_cpu_binding": true, "multistream_overlap_shared_expert": true, "recompute_scheduler_enable": true}' \
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "3", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r3.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r3.pid
  echo 5a8e16d89a509011 > /workspace/ascend-pd/run/decode-0-r3.spec
  echo "decode-0-r3: started pid $(cat /workspace/ascend-pd/run/decode-0-r3.pid)"
fi
# decode-0-r4: DP rank 4/32, devices 4, port 7104
if needs_start /workspace/ascend-pd/run/decode-0-r4.pid 49670591d771973d 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r4.log
  setsid nohup env \
      -u http_proxy -u https_proxy -u ftp_proxy -u all_proxy -u grpc_proxy -u HTTP_PROXY -u HTTPS_PROXY -u FTP_PROXY -u ALL_PROXY -u GOOGLE_LOGTOSTDERR -u GOOGLE_ALSOLOGTOSTDERR \
      LD_PRELOAD="/usr/lib/aarch64-linux-gnu/libjemalloc.so.2:${LD_PRELOAD:-}" \
      HCCL_OP_EXPANSION_MODE="AIV" \
      TASK_QUEUE_ENABLE="1" \
      VLLM_RPC_TIMEOUT="3600000" \
      VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS="30000" \
      HCCL_EXEC_TIMEOUT="204" \
      HCCL_CONNECT_TIMEOUT="1200" \
      OMP_PROC_BIND="false" \
      OMP_NUM_THREADS="10" \
      PYTORCH_NPU_ALLOC_CONF="expandable_segments:True" \
      HCCL_BUFFSIZE="1024" \
      VLLM_ASCEND_APPLY_DSV4_PATCH="1" \
      HCCL_IF_IP="192.0.2.20" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="4" \
      DS_WORKER_ADDR="192.0.2.20:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.20 \
      --port 7104 \
      --data-parallel-size 32 \
      --data-parallel-rank 4 \
      --data-parallel-address 192.0.2.20 \
      --data-parallel-rpc-port 12321 \
      --tensor-parallel-size 1 \
      --served-model-name deepseek_v4 \
      --enable-expert-parallel \
      --seed 1024 \
      --max-model-len 1048576 \
      --block-size 128 \
      --async-scheduling \
      --no-disable-hybrid-kv-cache-manager \
      --trust-remote-code \
      --gpu-memory-utilization 0.9 \
      --quantization ascend \
      --safetensors-load-strategy prefetch \
      --model-loader-extra-config '{"enable_multithread_load": "true", "num_threads": 128}' \
      --tokenizer-mode deepseek_v4 \
      --tool-call-parser deepseek_v4 \
      --enable-auto-tool-choice \
      --reasoning-parser deepseek_v4 \
      --speculative-config '{"num_speculative_tokens": 1, "method": "mtp", "enforce_eager": true}' \
      --max-num-batched-tokens 60 \
      --max-num-seqs 30 \
      --no-enable-prefix-caching \
      --compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY"}' \
      --additional-config '{"ascend_compilation_config": {"enable_npugraph_ex": true, "enable_static_kernel": false}, "enable_cpu_binding": true, "multistream_overlap_shared_expert": true, "recompute_scheduler_enable": true}' \
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "4", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r4.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r4.pid
  echo 49670591d771973d > /workspace/ascend-pd/run/decode-0-r4.spec
  echo "decode-0-r4: started pid $(cat /workspace/ascend-pd/run/decode-0-r4.pid)"
fi
# decode-0-r5: DP rank 5/32, devices 5, port 7105
if needs_start /workspace/ascend-pd/run/decode-0-r5.pid fe1a4c8bb459344f 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r5.log
  setsid nohup env \
      -u http_proxy -u https_proxy -u ftp_proxy -u all_proxy -u grpc_proxy -u HTTP_PROXY -u HTTPS_PROXY -u FTP_PROXY -u ALL_PROXY -u GOOGLE_LOGTOSTDERR -u GOOGLE_ALSOLOGTOSTDERR \
      LD_PRELOAD="/usr/lib/aarch64-linux-gnu/libjemalloc.so.2:${LD_PRELOAD:-}" \
      HCCL_OP_EXPANSION_MODE="AIV" \
      TASK_QUEUE_ENABLE="1" \
      VLLM_RPC_TIMEOUT="3600000" \
      VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS="30000" \
      HCCL_EXEC_TIMEOUT="204" \
      HCCL_CONNECT_TIMEOUT="1200" \
      OMP_PROC_BIND="false" \
      OMP_NUM_THREADS="10" \
      PYTORCH_NPU_ALLOC_CONF="expandable_segments:True" \
      HCCL_BUFFSIZE="1024" \
      VLLM_ASCEND_APPLY_DSV4_PATCH="1" \
      HCCL_IF_IP="192.0.2.20" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="5" \
      DS_WORKER_ADDR="192.0.2.20:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.20 \
      --port 7105 \
      --data-parallel-size 32 \
      --data-parallel-rank 5 \
      --data-parallel-address 192.0.2.20 \
      --data-parallel-rpc-port 12321 \
      --tensor-parallel-size 1 \
      --served-model-name deepseek_v4 \
      --enable-expert-parallel \
      --seed 1024 \
      --max-model-len 1048576 \
      --block-size 128 \
      --async-scheduling \
      --no-disable-hybrid-kv-cache-manager \
      --trust-remote-code \
      --gpu-memory-utilization 0.9 \
      --quantization ascend \
      --safetensors-load-strategy prefetch \
      --model-loader-extra-config '{"enable_multithread_load": "true", "num_threads": 128}' \
      --tokenizer-mode deepseek_v4 \
      --tool-call-parser deepseek_v4 \
      --enable-auto-tool-choice \
      --reasoning-parser deepseek_v4 \
      --speculative-config '{"num_speculative_tokens": 1, "method": "mtp", "enforce_eager": true}' \
      --max-num-batched-tokens 60 \
      --max-num-seqs 30 \
      --no-enable-prefix-caching \
      --compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY"}' \
      --additional-config '{"ascend_compilation_config": {"enable_npugraph_ex": true, "enable_static_kernel": false}, "enable_cpu_binding": true, "multistream_overlap_shared_expert": true, "recompute_scheduler_enable": true}' \
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "5", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r5.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r5.pid
  echo fe1a4c8bb459344f > /workspace/ascend-pd/run/decode-0-r5.spec
  echo "decode-0-r5: started pid $(cat /workspace/ascend-pd/run/decode-0-r5.pid)"
fi
# decode-0-r6: DP rank 6/32, devices 6, port 7106
if needs_start /workspace/ascend-pd/run/decode-0-r6.pid bb64b72adca744db 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r6.log
  setsid nohup env \
      -u http_proxy -u https_proxy -u ftp_proxy -u all_proxy -u grpc_proxy -u HTTP_PROXY -u HTTPS_PROXY -u FTP_PROXY -u ALL_PROXY -u GOOGLE_LOGTOSTDERR -u GOOGLE_ALSOLOGTOSTDERR \
      LD_PRELOAD="/usr/lib/aarch64-linux-gnu/libjemalloc.so.2:${LD_PRELOAD:-}" \
      HCCL_OP_EXPANSION_MODE="AIV" \
      TASK_QUEUE_ENABLE="1" \
      VLLM_RPC_TIMEOUT="3600000" \
      VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS="30000" \
      HCCL_EXEC_TIMEOUT="204" \
      HCCL_CONNECT_TIMEOUT="1200" \
      OMP_PROC_BIND="false" \
      OMP_NUM_THREADS="10" \
      PYTORCH_NPU_ALLOC_CONF="expandable_segments:True" \
      HCCL_BUFFSIZE="1024" \
      VLLM_ASCEND_APPLY_DSV4_PATCH="1" \
      HCCL_IF_IP="192.0.2.20" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="6" \
      DS_WORKER_ADDR="192.0.2.20:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.20 \
      --port 7106 \
      --data-parallel-size 32 \
      --data-parallel-rank 6 \
      --data-parallel-address 192.0.2.20 \
      --data-parallel-rpc-port 12321 \
      --tensor-parallel-size 1 \
      --served-model-name deepseek_v4 \
      --enable-expert-parallel \
      --seed 1024 \
      --max-model-len 1048576 \
      --block-size 128 \
      --async-scheduling \
      --no-disable-hybrid-kv-cache-manager \
      --trust-remote-code \
      --gpu-memory-utilization 0.9 \
      --quantization ascend \
      --safetensors-load-strategy prefetch \
      --model-loader-extra-config '{"enable_multithread_load": "true", "num_threads": 128}' \
      --tokenizer-mode deepseek_v4 \
      --tool-call-parser deepseek_v4 \
      --enable-auto-tool-choice \
      --reasoning-parser deepseek_v4 \
      --speculative-config '{"num_speculative_tokens": 1, "method": "mtp", "enforce_eager": true}' \
      --max-num-batched-tokens 60 \
      --max-num-seqs 30 \
      --no-enable-prefix-caching \
      --compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY"}' \
      --additional-config '{"ascend_compilation_config": {"enable_npugraph_ex": true, "enable_static_kernel": false}, "enable_cpu_binding": true, "multistream_overlap_shared_expert": true, "recompute_scheduler_enable": true}' \
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "6", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r6.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r6.pid
  echo bb64b72adca744db > /workspace/ascend-pd/run/decode-0-r6.spec
  echo "decode-0-r6: started pid $(cat /workspace/ascend-pd/run/decode-0-r6.pid)"
fi
# decode-0-r7: DP rank 7/32, devices 7, port 7107
if needs_start /workspace/ascend-pd/run/decode-0-r7.pid 641a05028dd3abb3 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r7.log
  setsid nohup env \
      -u http_proxy -u https_proxy -u ftp_proxy -u all_proxy -u grpc_proxy -u HTTP_PROXY -u HTTPS_PROXY -u FTP_PROXY -u ALL_PROXY -u GOOGLE_LOGTOSTDERR -u GOOGLE_ALSOLOGTOSTDERR \
      LD_PRELOAD="/usr/lib/aarch64-linux-gnu/libjemalloc.so.2:${LD_PRELOAD:-}" \
      HCCL_OP_EXPANSION_MODE="AIV" \
      TASK_QUEUE_ENABLE="1" \
      VLLM_RPC_TIMEOUT="3600000" \
      VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS="30000" \
      HCCL_EXEC_TIMEOUT="204" \
      HCCL_CONNECT_TIMEOUT="1200" \
      OMP_PROC_BIND="false" \
      OMP_NUM_THREADS="10" \
      PYTORCH_NPU_ALLOC_CONF="expandable_segments:True" \
      HCCL_BUFFSIZE="1024" \
      VLLM_ASCEND_APPLY_DSV4_PATCH="1" \
      HCCL_IF_IP="192.0.2.20" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="7" \
      DS_WORKER_ADDR="192.0.2.20:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.20 \
      --port 7107 \
      --data-parallel-size 32 \
      --data-parallel-rank 7 \
      --data-parallel-address 192.0.2.20 \
      --data-parallel-rpc-port 12321 \
      --tensor-parallel-size 1 \
      --served-model-name deepseek_v4 \
      --enable-expert-parallel \
      --seed 1024 \
      --max-model-len 1048576 \
      --block-size 128 \
      --async-scheduling \
      --no-disable-hybrid-kv-cache-manager \
      --trust-remote-code \
      --gpu-memory-utilization 0.9 \
      --quantization ascend \
      --safetensors-load-strategy prefetch \
      --model-loader-extra-config '{"enable_multithread_load": "true", "num_threads": 128}' \
      --tokenizer-mode deepseek_v4 \
      --tool-call-parser deepseek_v4 \
      --enable-auto-tool-choice \
      --reasoning-parser deepseek_v4 \
      --speculative-config '{"num_speculative_tokens": 1, "method": "mtp", "enforce_eager": true}' \
      --max-num-batched-tokens 60 \
      --max-num-seqs 30 \
      --no-enable-prefix-caching \
      --compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY"}' \
      --additional-config '{"ascend_compilation_config": {"enable_npugraph_ex": true, "enable_static_kernel": false}, "enable_cpu_binding": true, "multistream_overlap_shared_expert": true, "recompute_scheduler_enable": true}' \
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "7", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r7.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r7.pid
  echo 641a05028dd3abb3 > /workspace/ascend-pd/run/decode-0-r7.spec
  echo "decode-0-r7: started pid $(cat /workspace/ascend-pd/run/decode-0-r7.pid)"
fi

# Wait until every local rank answers /health (ranks of a multi-node instance need their peers up).
deadline=$((SECONDS + 3600))
report=$((SECONDS + 60))
while :; do
  healthy=0
  check_rank decode-0-r0 http://192.0.2.20:7100/health && healthy=$((healthy + 1))
  check_rank decode-0-r1 http://192.0.2.20:7101/health && healthy=$((healthy + 1))
  check_rank decode-0-r2 http://192.0.2.20:7102/health && healthy=$((healthy + 1))
  check_rank decode-0-r3 http://192.0.2.20:7103/health && healthy=$((healthy + 1))
  check_rank decode-0-r4 http://192.0.2.20:7104/health && healthy=$((healthy + 1))
  check_rank decode-0-r5 http://192.0.2.20:7105/health && healthy=$((healthy + 1))
  check_rank decode-0-r6 http://192.0.2.20:7106/health && healthy=$((healthy + 1))
  check_rank decode-0-r7 http://192.0.2.20:7107/health && healthy=$((healthy + 1))
  if [ "$healthy" -eq 8 ]; then break; fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "decode-0 on d0: only $healthy of 8 ranks healthy after 3600s" >&2
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.20:7100/health 2>/dev/null || show_log decode-0-r0
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.20:7101/health 2>/dev/null || show_log decode-0-r1
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.20:7102/health 2>/dev/null || show_log decode-0-r2
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.20:7103/health 2>/dev/null || show_log decode-0-r3
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.20:7104/health 2>/dev/null || show_log decode-0-r4
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.20:7105/health 2>/dev/null || show_log decode-0-r5
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.20:7106/health 2>/dev/null || show_log decode-0-r6
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.20:7107/health 2>/dev/null || show_log decode-0-r7
    stop_local_ranks
    exit 1
  fi
  if [ "$SECONDS" -ge "$report" ]; then
    echo "decode-0 on d0: $healthy/8 ranks healthy after $SECONDS s"
    report=$((SECONDS + 60))
  fi
  sleep 5
done
echo "decode-0 on d0: 8/8 ranks healthy"
