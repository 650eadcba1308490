#!/usr/bin/env bash
# ascend-pd a2-8node: decode-0 ranks decode-0-r16, decode-0-r17, decode-0-r18, decode-0-r19, decode-0-r20, decode-0-r21, decode-0-r22, decode-0-r23 on d2
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
  case "$(basename "$pidfile" .pid)" in decode-0-r16|decode-0-r17|decode-0-r18|decode-0-r19|decode-0-r20|decode-0-r21|decode-0-r22|decode-0-r23) ;; *) echo "stopping $(basename "$pidfile" .pid): no longer planned"; unplanned+=("$pidfile") ;; esac
done
if [ "${#unplanned[@]}" -gt 0 ]; then stop_pidfiles 60 "${unplanned[@]}"; fi
stop_local_ranks() {
stop_pidfiles 60 /workspace/ascend-pd/run/decode-0-r16.pid /workspace/ascend-pd/run/decode-0-r17.pid /workspace/ascend-pd/run/decode-0-r18.pid /workspace/ascend-pd/run/decode-0-r19.pid /workspace/ascend-pd/run/decode-0-r20.pid /workspace/ascend-pd/run/decode-0-r21.pid /workspace/ascend-pd/run/decode-0-r22.pid /workspace/ascend-pd/run/decode-0-r23.pid
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

# decode-0-r16: DP rank 16/32, devices 0, port 7100
if needs_start /workspace/ascend-pd/run/decode-0-r16.pid 54f5bdd12d819d38 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r16.log
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
      HCCL_IF_IP="192.0.2.22" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="0" \
      DS_WORKER_ADDR="192.0.2.22:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.22 \
      --port 7100 \
      --data-parallel-size 32 \
      --data-parallel-rank 16 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "16", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r16.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r16.pid
  echo 54f5bdd12d819d38 > /workspace/ascend-pd/run/decode-0-r16.spec
  echo "decode-0-r16: started pid $(cat /workspace/ascend-pd/run/decode-0-r16.pid)"
fi
# decode-0-r17: DP rank 17/32, devices 1, port 7101
if needs_start /workspace/ascend-pd/run/decode-0-r17.pid c461163695f55e27 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r17.log
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
      HCCL_IF_IP="192.0.2.22" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="1" \
      DS_WORKER_ADDR="192.0.2.22:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.22 \
      --port 7101 \
      --data-parallel-size 32 \
      --data-parallel-rank 17 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "17", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r17.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r17.pid
  echo c461163695f55e27 > /workspace/ascend-pd/run/decode-0-r17.spec
  echo "decode-0-r17: started pid $(cat /workspace/ascend-pd/run/decode-0-r17.pid)"
fi
# decode-0-r18: DP rank 18/32, devices 2, port 7102
if needs_start /workspace/ascend-pd/run/decode-0-r18.pid cb85f2d9b369231a 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r18.log
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
      HCCL_IF_IP="192.0.2.22" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="2" \
      DS_WORKER_ADDR="192.0.2.22:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.22 \
      --port 7102 \
      --data-parallel-size 32 \
      --data-parallel-rank 18 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "18", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r18.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r18.pid
  echo cb85f2d9b369231a > /workspace/ascend-pd/run/decode-0-r18.spec
  echo "decode-0-r18: started pid $(cat /workspace/ascend-pd/run/decode-0-r18.pid)"
fi
# decode-0-r19: DP rank 19/32, devices 3, port 7103
if needs_start /workspace/ascend-pd/run/decode-0-r19.pid d85b99b698aa8751 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r19.log
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
      HCCL_IF_IP="192.0.2.22" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="3" \
      DS_WORKER_ADDR="192.0.2.22:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.22 \
      --port 7103 \
      --data-parallel-size 32 \
      --data-parallel-rank 19 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "19", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r19.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r19.pid
  echo d85b99b698aa8751 > /workspace/ascend-pd/run/decode-0-r19.spec
  echo "decode-0-r19: started pid $(cat /workspace/ascend-pd/run/decode-0-r19.pid)"
fi
# decode-0-r20: DP rank 20/32, devices 4, port 7104
if needs_start /workspace/ascend-pd/run/decode-0-r20.pid da1c7a4b760bf5f8 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r20.log
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
      HCCL_IF_IP="192.0.2.22" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="4" \
      DS_WORKER_ADDR="192.0.2.22:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.22 \
      --port 7104 \
      --data-parallel-size 32 \
      --data-parallel-rank 20 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "20", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r20.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r20.pid
  echo da1c7a4b760bf5f8 > /workspace/ascend-pd/run/decode-0-r20.spec
  echo "decode-0-r20: started pid $(cat /workspace/ascend-pd/run/decode-0-r20.pid)"
fi
# decode-0-r21: DP rank 21/32, devices 5, port 7105
if needs_start /workspace/ascend-pd/run/decode-0-r21.pid d15de5dfaf79fa68 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r21.log
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
      HCCL_IF_IP="192.0.2.22" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="5" \
      DS_WORKER_ADDR="192.0.2.22:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.22 \
      --port 7105 \
      --data-parallel-size 32 \
      --data-parallel-rank 21 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "21", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r21.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r21.pid
  echo d15de5dfaf79fa68 > /workspace/ascend-pd/run/decode-0-r21.spec
  echo "decode-0-r21: started pid $(cat /workspace/ascend-pd/run/decode-0-r21.pid)"
fi
# decode-0-r22: DP rank 22/32, devices 6, port 7106
if needs_start /workspace/ascend-pd/run/decode-0-r22.pid 0611dc4110801c42 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r22.log
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
      HCCL_IF_IP="192.0.2.22" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="6" \
      DS_WORKER_ADDR="192.0.2.22:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.22 \
      --port 7106 \
      --data-parallel-size 32 \
      --data-parallel-rank 22 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "22", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r22.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r22.pid
  echo 0611dc4110801c42 > /workspace/ascend-pd/run/decode-0-r22.spec
  echo "decode-0-r22: started pid $(cat /workspace/ascend-pd/run/decode-0-r22.pid)"
fi
# decode-0-r23: DP rank 23/32, devices 7, port 7107
if needs_start /workspace/ascend-pd/run/decode-0-r23.pid 0c9627e8a3aae563 60; then
  rotate_log /workspace/ascend-pd/logs/decode-0-r23.log
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
      HCCL_IF_IP="192.0.2.22" \
      GLOO_SOCKET_IFNAME="enp67s0f0np0" \
      TP_SOCKET_IFNAME="enp67s0f0np0" \
      HCCL_SOCKET_IFNAME="enp67s0f0np0" \
      ASCEND_RT_VISIBLE_DEVICES="7" \
      DS_WORKER_ADDR="192.0.2.22:18481" \
      PYTHONHASHSEED="0" \
      vllm serve /home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/ \
      --host 192.0.2.22 \
      --port 7107 \
      --data-parallel-size 32 \
      --data-parallel-rank 23 \
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
      --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"connectors": [{"kv_connector": "MooncakeHybridConnector", "kv_role": "kv_consumer", "kv_port": "30100", "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector", "kv_connector_extra_config": {"use_ascend_direct": true, "prefill": {"dp_size": 2, "tp_size": 4}, "decode": {"dp_size": 32, "tp_size": 1}}}, {"kv_connector": "AscendStoreConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"lookup_rpc_port": "23", "backend": "yuanrong"}}]}}' \
      > /workspace/ascend-pd/logs/decode-0-r23.log 2>&1 < /dev/null &
  echo $! > /workspace/ascend-pd/run/decode-0-r23.pid
  echo 0c9627e8a3aae563 > /workspace/ascend-pd/run/decode-0-r23.spec
  echo "decode-0-r23: started pid $(cat /workspace/ascend-pd/run/decode-0-r23.pid)"
fi

# Wait until every local rank answers /health (ranks of a multi-node instance need their peers up).
deadline=$((SECONDS + 3600))
report=$((SECONDS + 60))
while :; do
  healthy=0
  check_rank decode-0-r16 http://192.0.2.22:7100/health && healthy=$((healthy + 1))
  check_rank decode-0-r17 http://192.0.2.22:7101/health && healthy=$((healthy + 1))
  check_rank decode-0-r18 http://192.0.2.22:7102/health && healthy=$((healthy + 1))
  check_rank decode-0-r19 http://192.0.2.22:7103/health && healthy=$((healthy + 1))
  check_rank decode-0-r20 http://192.0.2.22:7104/health && healthy=$((healthy + 1))
  check_rank decode-0-r21 http://192.0.2.22:7105/health && healthy=$((healthy + 1))
  check_rank decode-0-r22 http://192.0.2.22:7106/health && healthy=$((healthy + 1))
  check_rank decode-0-r23 http://192.0.2.22:7107/health && healthy=$((healthy + 1))
  if [ "$healthy" -eq 8 ]; then break; fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "decode-0 on d2: only $healthy of 8 ranks healthy after 3600s" >&2
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.22:7100/health 2>/dev/null || show_log decode-0-r16
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.22:7101/health 2>/dev/null || show_log decode-0-r17
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.22:7102/health 2>/dev/null || show_log decode-0-r18
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.22:7103/health 2>/dev/null || show_log decode-0-r19
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.22:7104/health 2>/dev/null || show_log decode-0-r20
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.22:7105/health 2>/dev/null || show_log decode-0-r21
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.22:7106/health 2>/dev/null || show_log decode-0-r22
    curl --noproxy '*' -fsS -o /dev/null -m 3 http://192.0.2.22:7107/health 2>/dev/null || show_log decode-0-r23
    stop_local_ranks
    exit 1
  fi
  if [ "$SECONDS" -ge "$report" ]; then
    echo "decode-0 on d2: $healthy/8 ranks healthy after $SECONDS s"
    report=$((SECONDS + 60))
  fi
  sleep 5
done
echo "decode-0 on d2: 8/8 ranks healthy"
