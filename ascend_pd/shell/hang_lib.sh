# shellcheck shell=bash disable=SC2154  # its parameters are set by the script that includes it
# Hang detection of the liveness probe (the same rule as `status` and `heal`, ascend_pd/hang.py): a
# rank that answers /health is hung when it has requests running and neither
# vllm:generation_tokens_total nor vllm:request_success_total has moved for hang_s seconds. One
# probe run sees one moment, so each run leaves, per rank, the counters and since when they have
# been flat while busy in hang_dir; the first run that sees a rank busy starts its clock, so a hang
# fails the probe within hang_s + one probe period. A restarted rank (another
# process_start_time_seconds) starts afresh.
#
# Parameters (set by the probe before this library): hang_dir, hang_s, and the curl options in
# hang_curl (an array).

hang_check() {  # hang_check NAME METRICS_URL: fail "... hung ..." when the rank is hung
  local sample running gen succ started prev_gen="" prev_succ="" prev_started="" since="" now
  # An unreadable /metrics is not a hang: /health above judges the rank.
  sample=$(curl "${hang_curl[@]}" "$2" 2>/dev/null | awk '
    /^vllm:num_requests_running[{ ]/ {r += $NF}
    /^vllm:generation_tokens_total[{ ]/ {g += $NF}
    /^vllm:request_success_total[{ ]/ {s += $NF}
    /^process_start_time_seconds[{ ]/ {p = $NF}
    END {printf "%.0f %.17g %.17g %s\n", r, g, s, (p == "" ? "-" : p)}') || return 0
  read -r running gen succ started <<< "$sample"
  mkdir -p "$hang_dir"
  if [ -f "$hang_dir/$1" ]; then read -r prev_gen prev_succ prev_started since < "$hang_dir/$1" || true; fi
  now=$(date +%s)
  if [ "$running" -le 0 ]; then
    since=-
  elif [ "$gen $succ $started" != "$prev_gen $prev_succ $prev_started" ] || [ "${since:--}" = - ]; then
    since=$now
  fi
  echo "$gen $succ $started $since" > "$hang_dir/$1.tmp" && mv -f "$hang_dir/$1.tmp" "$hang_dir/$1"
  if [ "$since" != - ] && [ $((now - since)) -ge "$hang_s" ]; then
    fail "rank $1: hung: $running request(s) running, vllm:generation_tokens_total flat at $gen and vllm:request_success_total flat at $succ since $(date -u -d "@$since" +%H:%M:%SZ) ($((now - since))s >= hang.seconds $hang_s)"
  fi
}
