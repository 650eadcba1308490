# shellcheck shell=bash disable=SC2154  # its parameters are set by the script that includes it
# A DP group spans nodes, and each node's launch runs on its own. Each launch records its state in
# etcd (which every node reaches, and which is up before any launch runs) so that when one node's
# launch fails, the launches of the other nodes stop waiting for ranks that will never come and
# fail too (and are therefore all run again together by the next `pulumi up`).
#
# Parameters (set by the script before this library): etcd_url, group_key (the instance's prefix,
# ending in /), node.

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
