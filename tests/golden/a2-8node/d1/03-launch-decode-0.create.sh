#!/usr/bin/env bash
# ascend-pd a2-8node: decode-0 ranks decode-0-r8, decode-0-r9, decode-0-r10, decode-0-r11, decode-0-r12, decode-0-r13, decode-0-r14, decode-0-r15 on d1
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
  case "$(basename "$pidfile" .pid)" in decode-0-r8|decode-0-r9|decode-0-r10|decode-0-r11|decode-0-r12|decode-0-r13|decode-0-r14|decode-0-r15) ;; *) echo "stopping $(basename "$pidfile" .pid): no longer planned"; unplanned+=("$pidfile") ;; esac
done
if [ "${#unplanned[@]}" -gt 0 ]; then stop_pidfiles 60 "${unplanned[@]}"; fi
stop_local_ranks() {
stop_pidfiles 60 /workspace/ascend-pd/run/decode-0-r8.pid /workspace/ascend-pd/run/decode-0-r9.pid /workspace/ascend-pd/run/decode-0-r10.pid /workspace/ascend-pd/run/decode-0-r11.pid /workspace/ascend-pd/run/decode-0-r12.pid /workspace/ascend-pd/run/decode-0-r13.pid /workspace/ascend-pd/run/decode-0-r14.pid /workspace/ascend-pd/run/decode-0-r15.pid
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

# decode-0-r8: DP rank 8/32, devices 0, port 7100
if needs_start /workspace/ascend-pd/run/decode-0-r8.pid 8a386e3c9a47c0cc 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r8.log
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
      HCCL_IF_IP="192.0.2.21" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="0" \
      DS_WORKER_ADDR="192.0.2.21:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.21 \
      --port 7100 \
      --data-parallel-size 32 \
      --data-parallel-rank 8 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "8", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r8.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r8.pid
  echo 8a386e3c9a47c0cc > /workspace/ascend-pd/run/decode-0-r8.spec
  echo "decode-0-r8: started pid $(cat /workspace/ascend-pd/run/decode-0-r8.pid)"
fi
# decode-0-r9: DP rank 9/32, devices 1, port 7101
if needs_start /workspace/ascend-pd/run/decode-0-r9.pid 49e84dc7b18cf861 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r9.log
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
      HCCL_IF_IP="192.0.2.21" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="1" \
      DS_WORKER_ADDR="192.0.2.21:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.21 \
      --port 7101 \
      --data-parallel-size 32 \
      --data-parallel-rank 9 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "9", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r9.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r9.pid
  echo 49e84dc7b18cf861 > /workspace/ascend-pd/run/decode-0-r9.spec
  echo "decode-0-r9: started pid $(cat /workspace/ascend-pd/run/decode-0-r9.pid)"
fi
# decode-0-r10: DP rank 10/32, devices 2, port 7102
if needs_start /workspace/ascend-pd/run/decode-0-r10.pid 8b7a25d0e8920fe0 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r10.log
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
      HCCL_IF_IP="192.0.2.21" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="2" \
      DS_WORKER_ADDR="192.0.2.21:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.21 \
      --port 7102 \
      --data-parallel-size 32 \
      --data-parallel-rank 10 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "10", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r10.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r10.pid
  echo 8b7a25d0e8920fe0 > /workspace/ascend-pd/run/decode-0-r10.spec
  echo "decode-0-r10: started pid $(cat /workspace/ascend-pd/run/decode-0-r10.pid)"
fi
# decode-0-r11: DP rank 11/32, devices 3, port 7103
if needs_start /workspace/ascend-pd/run/decode-0-r11.pid c204514ce40ed7ec 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r11.log
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
      HCCL_IF_IP="192.0.2.21" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="3" \
      DS_WORKER_ADDR="192.0.2.21:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.21 \
      --port 7103 \
      --data-parallel-size 32 \
      --data-parallel-rank 11 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "11", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r11.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r11.pid
  echo c204514ce40ed7ec > /workspace/ascend-pd/run/decode-0-r11.spec
  echo "decode-0-r11: started pid $(cat /workspace/ascend-pd/run/decode-0-r11.pid)"
fi
# decode-0-r12: DP rank 12/32, devices 4, port 7104
if needs_start /workspace/ascend-pd/run/decode-0-r12.pid 6affb14d507e3a91 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r12.log
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
      HCCL_IF_IP="192.0.2.21" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="4" \
      DS_WORKER_ADDR="192.0.2.21:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.21 \
      --port 7104 \
      --data-parallel-size 32 \
      --data-parallel-rank 12 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "12", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r12.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r12.pid
  echo 6affb14d507e3a91 > /workspace/ascend-pd/run/decode-0-r12.spec
  echo "decode-0-r12: started pid $(cat /workspace/ascend-pd/run/decode-0-r12.pid)"
fi
# decode-0-r13: DP rank 13/32, devices 5, port 7105
if needs_start /workspace/ascend-pd/run/decode-0-r13.pid 3661d1f8cbeef353 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r13.log
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
      HCCL_IF_IP="192.0.2.21" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="5" \
      DS_WORKER_ADDR="192.0.2.21:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.21 \
      --port 7105 \
      --data-parallel-size 32 \
      --data-parallel-rank 13 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "13", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r13.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r13.pid
  echo 3661d1f8cbeef353 > /workspace/ascend-pd/run/decode-0-r13.spec
  echo "decode-0-r13: started pid $(cat /workspace/ascend-pd/run/decode-0-r13.pid)"
fi
# decode-0-r14: DP rank 14/32, devices 6, port 7106
if needs_start /workspace/ascend-pd/run/decode-0-r14.pid 920c27d92b6bbfbd 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r14.log
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
      HCCL_IF_IP="192.0.2.21" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="6" \
      DS_WORKER_ADDR="192.0.2.21:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.21 \
      --port 7106 \
      --data-parallel-size 32 \
      --data-parallel-rank 14 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "14", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r14.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r14.pid
  echo 920c27d92b6bbfbd > /workspace/ascend-pd/run/decode-0-r14.spec
  echo "decode-0-r14: started pid $(cat /workspace/ascend-pd/run/decode-0-r14.pid)"
fi
# decode-0-r15: DP rank 15/32, devices 7, port 7107
if needs_start /workspace/ascend-pd/run/decode-0-r15.pid 4ec63131af2ddddc 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r15.log
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
      HCCL_IF_IP="192.0.2.21" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="7" \
      DS_WORKER_ADDR="192.0.2.21:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.21 \
      --port 7107 \
      --data-parallel-size 32 \
      --data-parallel-rank 15 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "15", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r15.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r15.pid
  echo 4ec63131af2ddddc > /workspace/ascend-pd/run/decode-0-r15.spec
  echo "decode-0-r15: started pid $(cat /workspace/ascend-pd/run/decode-0-r15.pid)"
fi

# Wait until every local rank answers /health (ranks of a multi-node instance need their peers up).
deadline=$((SECONDS + 3600))
report=$((SECONDS + 60))
while :; do
  healthy=0
  check_rank decode-0-r8 http://192.0.2.21:7100/health && healthy=$((healthy + 1))
  check_rank decode-0-r9 http://192.0.2.21:7101/health && healthy=$((healthy + 1))
  check_rank decode-0-r10 http://192.0.2.21:7102/health && healthy=$((healthy + 1))
  check_rank decode-0-r11 http://192.0.2.21:7103/health && healthy=$((healthy + 1))
  check_rank decode-0-r12 http://192.0.2.21:7104/health && healthy=$((healthy + 1))
  check_rank decode-0-r13 http://192.0.2.21:7105/health && healthy=$((healthy + 1))
  check_rank decode-0-r14 http://192.0.2.21:7106/health && healthy=$((healthy + 1))
  check_rank decode-0-r15 http://192.0.2.21:7107/health && healthy=$((healthy + 1))
  if [ "$healthy" -eq 8 ]; then break; fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "decode-0 on d1: only $healthy of 8 ranks healthy after 3600s" >&2
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.21:7100/health 2>/dev/null || show_log decode-0-r8
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.21:7101/health 2>/dev/null || show_log decode-0-r9
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.21:7102/health 2>/dev/null || show_log decode-0-r10
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.21:7103/health 2>/dev/null || show_log decode-0-r11
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.21:7104/health 2>/dev/null || show_log decode-0-r12
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.21:7105/health 2>/dev/null || show_log decode-0-r13
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.21:7106/health 2>/dev/null || show_log decode-0-r14
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.21:7107/health 2>/dev/null || show_log decode-0-r15
    stop_local_ranks
    exit 1
  fi
  if [ "$SECONDS" -ge "$report" ]; then
    echo "decode-0 on d1: $healthy/8 ranks healthy after $SECONDS s"
    report=$((SECONDS + 60))
  fi
  sleep 5
done
echo "decode-0 on d1: 8/8 ranks healthy"
