# shellcheck shell=bash disable=SC2154  # its parameters are set by the script that includes it
# The NPU ping round of `doctor` (after preflight_lib.sh): every "DEV/KIND/IP" of ping_targets,
# all at once, as `hccn_tool -i DEV -ping|-hccs_ping -g address IP pkt 3`; an address that answers
# none of the 3 packets fails.

check_ping() {
  local t dev kind ip n=0 lanes=" "
  for t in $ping_targets; do
    IFS=/ read -r dev kind ip <<< "$t"
    n=$((n + 1))
    echo "$n $kind $ip" >> "$tmp/lane.$dev"
    case "$lanes" in *" $dev "*) ;; *) lanes="$lanes$dev " ;; esac
  done
  # One lane per NPU, its pings one after another (hccn_tool pings from one device at a time);
  # the NPUs at once.
  for dev in $lanes; do
    while read -r i kind ip; do
      hccn_tool -i "$dev" "-$kind" -g address "$ip" pkt 3 > "$tmp/ping.$i" 2>&1 || true
      echo "$dev $kind $ip" > "$tmp/ping.$i.what"
    done < "$tmp/lane.$dev" &
  done
  wait
  local i got got_n w2 bad=""
  for ((i = 1; i <= n; i++)); do
    read -r dev kind ip < "$tmp/ping.$i.what"
    got=""
    while read -r _ w2 _ got_n _; do  # "3 packets transmitted, 3 received, 0.00% packet loss"
      if [ "$w2" = packets ]; then got=$got_n; fi
    done < "$tmp/ping.$i"
    if [ -z "${got:-}" ] || [ "$got" = 0 ]; then bad="${bad}NPU $dev -> $ip ($kind) unreachable; "; fi
  done
  if [ -n "$bad" ]; then
    emit ping fail "${bad%; }" "check the RoCE cabling and switch ports of those NPUs, and both nodes' /etc/hccn.conf" "{\"pings\":$n}"
  else
    emit ping pass "$n pings answered" "" "{\"pings\":$n}"
  fi
}
