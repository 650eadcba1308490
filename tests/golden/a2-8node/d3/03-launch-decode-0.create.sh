#!/usr/bin/env bash
# ascend-pd a2-8node: decode-0 ranks decode-0-r24, decode-0-r25, decode-0-r26, decode-0-r27, decode-0-r28, decode-0-r29, decode-0-r30, decode-0-r31 on d3
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
  case "$(basename "$pidfile" .pid)" in decode-0-r24|decode-0-r25|decode-0-r26|decode-0-r27|decode-0-r28|decode-0-r29|decode-0-r30|decode-0-r31) ;; *) echo "stopping $(basename "$pidfile" .pid): no longer planned"; unplanned+=("$pidfile") ;; esac
done
if [ "${#unplanned[@]}" -gt 0 ]; then stop_pidfiles 60 "${unplanned[@]}"; fi
stop_local_ranks() {
stop_pidfiles 60 /workspace/ascend-pd/run/decode-0-r24.pid /workspace/ascend-pd/run/decode-0-r25.pid /workspace/ascend-pd/run/decode-0-r26.pid /workspace/ascend-pd/run/decode-0-r27.pid /workspace/ascend-pd/run/decode-0-r28.pid /workspace/ascend-pd/run/decode-0-r29.pid /workspace/ascend-pd/run/decode-0-r30.pid /workspace/ascend-pd/run/decode-0-r31.pid
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

# decode-0-r24: DP rank 24/32, devices 0, port 7100
if needs_start /workspace/ascend-pd/run/decode-0-r24.pid 275a8816b64879dc 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r24.log
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
      HCCL_IF_IP="192.0.2.23" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="0" \
      DS_WORKER_ADDR="192.0.2.23:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.23 \
      --port 7100 \
      --data-parallel-size 32 \
      --data-parallel-rank 24 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "24", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r24.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r24.pid
  echo 275a8816b64879dc > /workspace/ascend-pd/run/decode-0-r24.spec
  echo "decode-0-r24: started pid $(cat /workspace/ascend-pd/run/decode-0-r24.pid)"
fi
# decode-0-r25: DP rank 25/32, devices 1, port 7101
if needs_start /workspace/ascend-pd/run/decode-0-r25.pid e27aa616e94f9493 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r25.log
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
      HCCL_IF_IP="192.0.2.23" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="1" \
      DS_WORKER_ADDR="192.0.2.23:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.23 \
      --port 7101 \
      --data-parallel-size 32 \
      --data-parallel-rank 25 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "25", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r25.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r25.pid
  echo e27aa616e94f9493 > /workspace/ascend-pd/run/decode-0-r25.spec
  echo "decode-0-r25: started pid $(cat /workspace/ascend-pd/run/decode-0-r25.pid)"
fi
# decode-0-r26: DP rank 26/32, devices 2, port 7102
if needs_start /workspace/ascend-pd/run/decode-0-r26.pid ee0c31406fd186a0 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r26.log
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
      HCCL_IF_IP="192.0.2.23" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="2" \
      DS_WORKER_ADDR="192.0.2.23:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.23 \
      --port 7102 \
      --data-parallel-size 32 \
      --data-parallel-rank 26 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "26", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r26.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r26.pid
  echo ee0c31406fd186a0 > /workspace/ascend-pd/run/decode-0-r26.spec
  echo "decode-0-r26: started pid $(cat /workspace/ascend-pd/run/decode-0-r26.pid)"
fi
# decode-0-r27: DP rank 27/32, devices 3, port 7103
if needs_start /workspace/ascend-pd/run/decode-0-r27.pid a0fc91b58505f0f5 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r27.log
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
      HCCL_IF_IP="192.0.2.23" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="3" \
      DS_WORKER_ADDR="192.0.2.23:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.23 \
      --port 7103 \
      --data-parallel-size 32 \
      --data-parallel-rank 27 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "27", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r27.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r27.pid
  echo a0fc91b58505f0f5 > /workspace/ascend-pd/run/decode-0-r27.spec
  echo "decode-0-r27: started pid $(cat /workspace/ascend-pd/run/decode-0-r27.pid)"
fi
# decode-0-r28: DP rank 28/32, devices 4, port 7104
if needs_start /workspace/ascend-pd/run/decode-0-r28.pid 67c4c4f0f9249f5c 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r28.log
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
      HCCL_IF_IP="192.0.2.23" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="4" \
      DS_WORKER_ADDR="192.0.2.23:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.23 \
      --port 7104 \
      --data-parallel-size 32 \
      --data-parallel-rank 28 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "28", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r28.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r28.pid
  echo 67c4c4f0f9249f5c > /workspace/ascend-pd/run/decode-0-r28.spec
  echo "decode-0-r28: started pid $(cat /workspace/ascend-pd/run/decode-0-r28.pid)"
fi
# decode-0-r29: DP rank 29/32, devices 5, port 7105
if needs_start /workspace/ascend-pd/run/decode-0-r29.pid bd959e80bbe64786 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r29.log
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
      HCCL_IF_IP="192.0.2.23" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="5" \
      DS_WORKER_ADDR="192.0.2.23:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.23 \
      --port 7105 \
      --data-parallel-size 32 \
      --data-parallel-rank 29 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "29", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r29.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r29.pid
  echo bd959e80bbe64786 > /workspace/ascend-pd/run/decode-0-r29.spec
  echo "decode-0-r29: started pid $(cat /workspace/ascend-pd/run/decode-0-r29.pid)"
fi
# decode-0-r30: DP rank 30/32, devices 6, port 7106
if needs_start /workspace/ascend-pd/run/decode-0-r30.pid 17960c905e2b2200 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r30.log
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
      HCCL_IF_IP="192.0.2.23" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="6" \
      DS_WORKER_ADDR="192.0.2.23:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.23 \
      --port 7106 \
      --data-parallel-size 32 \
      --data-parallel-rank 30 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "30", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r30.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r30.pid
  echo 17960c905e2b2200 > /workspace/ascend-pd/run/decode-0-r30.spec
  echo "decode-0-r30: started pid $(cat /workspace/ascend-pd/run/decode-0-r30.pid)"
fi
# decode-0-r31: DP rank 31/32, devices 7, port 7107
if needs_start /workspace/ascend-pd/run/decode-0-r31.pid 6378b5abc18b8ffa 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r31.log
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
      HCCL_IF_IP="192.0.2.23" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="7" \
      DS_WORKER_ADDR="192.0.2.23:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.23 \
      --port 7107 \
      --data-parallel-size 32 \
      --data-parallel-rank 31 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "31", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r31.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r31.pid
  echo 6378b5abc18b8ffa > /workspace/ascend-pd/run/decode-0-r31.spec
  echo "decode-0-r31: started pid $(cat /workspace/ascend-pd/run/decode-0-r31.pid)"
fi

# Wait until every local rank answers /health (ranks of a multi-node instance need their peers up).
deadline=$((SECONDS + 3600))
report=$((SECONDS + 60))
while :; do
  healthy=0
  check_rank decode-0-r24 http://192.0.2.23:7100/health && healthy=$((healthy + 1))
  check_rank decode-0-r25 http://192.0.2.23:7101/health && healthy=$((healthy + 1))
  check_rank decode-0-r26 http://192.0.2.23:7102/health && healthy=$((healthy + 1))
  check_rank decode-0-r27 http://192.0.2.23:7103/health && healthy=$((healthy + 1))
  check_rank decode-0-r28 http://192.0.2.23:7104/health && healthy=$((healthy + 1))
  check_rank decode-0-r29 http://192.0.2.23:7105/health && healthy=$((healthy + 1))
  check_rank decode-0-r30 http://192.0.2.23:7106/health && healthy=$((healthy + 1))
  check_rank decode-0-r31 http://192.0.2.23:7107/health && healthy=$((healthy + 1))
  if [ "$healthy" -eq 8 ]; then break; fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "decode-0 on d3: only $healthy of 8 ranks healthy after 3600s" >&2
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.23:7100/health 2>/dev/null || show_log decode-0-r24
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.23:7101/health 2>/dev/null || show_log decode-0-r25
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.23:7102/health 2>/dev/null || show_log decode-0-r26
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.23:7103/health 2>/dev/null || show_log decode-0-r27
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.23:7104/health 2>/dev/null || show_log decode-0-r28
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.23:7105/health 2>/dev/null || show_log decode-0-r29
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.23:7106/health 2>/dev/null || show_log decode-0-r30
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.23:7107/health 2>/dev/null || show_log decode-0-r31
    stop_local_ranks
    exit 1
  fi
  if [ "$SECONDS" -ge "$report" ]; then
    echo "decode-0 on d3: $healthy/8 ranks healthy after $SECONDS s"
    report=$((SECONDS + 60))
  fi
  sleep 5
done
echo "decode-0 on d3: 8/8 ranks healthy"
