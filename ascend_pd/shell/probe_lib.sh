# shellcheck shell=bash disable=SC2154  # its parameters are set by the script that includes it
# Verdict bookkeeping of the node probes: every check adds to `passed` or `failed`, then `finish`
# prints ONE line, appends it with a UTC timestamp to the probe's rotated log, and exits 0 or 1.
#
# Parameters (set by the probe before this library): probe (liveness/readiness), node, probe_log,
# log_keep (old logs kept, .1 newest), log_max_bytes (rotation size).

failed=""
passed=""
fail() { failed="${failed}${failed:+; }$1"; }
pass() { passed="${passed}${passed:+; }$1"; }

rotate_probe_log() {  # once the log reaches log_max_bytes: log -> log.1 -> ... -> log.<log_keep>
  local size i
  size=$(stat -c %s "$probe_log" 2>/dev/null) || return 0
  [ "$size" -ge "$log_max_bytes" ] || return 0
  rm -f "$probe_log.$log_keep"
  for ((i = log_keep - 1; i >= 1; i--)); do
    if [ -f "$probe_log.$i" ]; then mv -f "$probe_log.$i" "$probe_log.$((i + 1))"; fi
  done
  mv -f "$probe_log" "$probe_log.1"
}

finish() {  # print the verdict (one line), log it, exit 0 or 1
  local line code
  if [ -z "$failed" ]; then
    line="$probe $node: OK ($passed)"
    code=0
  else
    line="$probe $node: FAIL ($failed)"
    code=1
  fi
  echo "$line"
  { rotate_probe_log && printf '%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$line" >> "$probe_log"; } 2>/dev/null || true
  exit "$code"
}
