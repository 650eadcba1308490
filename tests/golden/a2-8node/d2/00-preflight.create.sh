#!/usr/bin/env bash
# ascend-pd a2-8node: preflight checks (read-only): clock versions page-size memory npu fabric ports weights docker network firewall on d2
set -euo pipefail
node=d2
report_mode=enforce
npus=8
hardware=a2
min_cann=8.5.0
min_driver=25.2.3
hugepages_kib=524288000
shm_kib=0
ports='7100/decode-0-r16:decode.portBase 7101/decode-0-r17:decode.portBase 7102/decode-0-r18:decode.portBase 7103/decode-0-r19:decode.portBase 7104/decode-0-r20:decode.portBase 7105/decode-0-r21:decode.portBase 7106/decode-0-r22:decode.portBase 7107/decode-0-r23:decode.portBase 18481/worker:yuanrong.port 30116/decode-0-r16-kv:decode.kvPort 30117/decode-0-r17-kv:decode.kvPort 30118/decode-0-r18-kv:decode.kvPort 30119/decode-0-r19-kv:decode.kvPort 30120/decode-0-r20-kv:decode.kvPort 30121/decode-0-r21-kv:decode.kvPort 30122/decode-0-r22-kv:decode.kvPort 30123/decode-0-r23-kv:decode.kvPort'
containers=ds_v4_flash_yr
model_path=/home/117_share/weight/DeepSeek-V4-Flash-w8a8-mtp/
image=quay.io/ascend/vllm-ascend:v0.20.2rc1
registry=quay.io
urls=https://gitcode.com/openeuler/yuanrong-datasystem/releases/download/v0.7.6.rc1/openyuanrong_datasystem-0.7.6rc1-cp311-cp311-manylinux_2_35_aarch64.whl
optional_urls=''
min_free_disk_kib=52428800
min_total_kib=0
firewall_table=ascend_pd
# Where the Ascend tools live when they are not on the SSH session's PATH.
PATH="$PATH:/usr/local/Ascend/driver/tools:/usr/local/sbin:/usr/local/bin"
export PATH
export LC_ALL=C

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n_fail=0
n_warn=0
summary=""

json_str() {  # json_str TEXT: TEXT as a JSON string (builtins only: called for every field)
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//[$'\t'$'\n'$'\r']/ }
  s=${s//[$'\001'-$'\037']/}
  printf '"%s"' "$s"
}

first_value() {  # first_value FILE PREFIX: the rest of FILE's first line starting with PREFIX, trimmed
  local line v
  while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in
      "$2"*) v=${line#"$2"}; v=${v#"${v%%[! ]*}"}; printf '%s' "${v%"${v##*[! ]}"}"; return 0 ;;
    esac
  done < "$1"
  return 0
}

emit() {  # emit CHECK pass|warn|fail DETAIL FIX [DATA-JSON]
  local check=$1 status=$2 detail=$3 fix=$4 data=${5:-'{}'}
  case "$status" in
    fail) n_fail=$((n_fail + 1)) ;;
    warn) n_warn=$((n_warn + 1)) ;;
  esac
  if [ "$report_mode" = report ]; then
    printf '{"check":%s,"status":"%s","detail":%s,"fix":%s,"data":%s}\n' \
      "$(json_str "$check")" "$status" "$(json_str "$detail")" "$(json_str "$fix")" "$data"
  else
    summary="$summary $check:$status"
    case "$status" in
      fail) echo "preflight $node: $check FAILED: $detail. Fix: $fix" >&2 ;;
      warn) echo "preflight $node: $check warning: $detail${fix:+. $fix}" >&2 ;;
    esac
  fi
}

finish() {
  if [ "$report_mode" = report ]; then exit 0; fi
  echo "preflight $node: $n_fail failed, $n_warn warnings:$summary"
  if [ "$n_fail" -gt 0 ] && [ "$report_mode" = enforce ]; then
    echo "preflight $node: stopping before anything is deployed on $node (ascend-pd:preflight.mode is enforce;" \
      "run python -m ascend_pd doctor for every node)" >&2
    exit 1
  fi
  exit 0
}

version_ge() {  # version_ge HAVE MIN: HAVE is MIN or later (8.0.RC2 < 8.5.0 < 8.5.1)
  [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" = "$2" ]
}

# Host pids of this stack's own containers: on a re-run, the ports and NPUs they hold are ours.
stack_pids=" "
load_stack_pids() {
  local c pid
  for c in $containers; do
    while read -r pid; do
      case "$pid" in ''|*[!0-9]*) ;; *) stack_pids="$stack_pids$pid " ;; esac
    done < <(docker top "$c" -eo pid 2>/dev/null || true)
  done
}
ours() { case "$stack_pids" in *" $1 "*) return 0 ;; esac; return 1; }

check_clock() {
  local now synced
  now=$(date +%s%3N)
  synced=$(timedatectl 2>/dev/null | awk -F': *' '/System clock synchronized:/ {print $2; exit}') || synced=""
  if [ "$synced" = yes ]; then
    emit clock pass "clock synchronized (NTP)" "" "{\"ms\":$now,\"synchronized\":true}"
  else
    emit clock warn "timedatectl says the system clock is not synchronized (${synced:-no answer})" \
      "enable NTP on every node (timedatectl set-ntp true, or chrony)" "{\"ms\":$now,\"synchronized\":false}"
  fi
}

check_versions() {
  local driver cann f problems=""
  driver=$(awk -F= '$1 == "Version" {print $2; exit}' /usr/local/Ascend/driver/version.info 2>/dev/null) || driver=""
  if [ -z "$driver" ]; then
    # The whole output through sed (quitting early would fail npu-smi with SIGPIPE), the first match kept.
    driver=$(npu-smi info 2>/dev/null | sed -n 's/.*Version: *\([0-9A-Za-z.]*\).*/\1/p') || driver=""
    driver=${driver%%$'\n'*}
  fi
  cann=""
  for f in /usr/local/Ascend/ascend-toolkit/latest/*/ascend_toolkit_install.info; do
    if [ -f "$f" ]; then cann=$(awk -F= '$1 == "version" {print $2; exit}' "$f"); break; fi
  done
  local data
  data="{\"driver\":$(json_str "$driver"),\"cann\":$(json_str "$cann")}"
  if [ -z "$driver" ]; then
    emit versions fail "no NPU driver found (/usr/local/Ascend/driver/version.info, npu-smi info)" \
      "install the Ascend driver (HDK) $min_driver or later" "$data"
    return
  fi
  if ! version_ge "$driver" "$min_driver"; then problems="driver $driver is older than $min_driver"; fi
  if [ -n "$cann" ] && ! version_ge "$cann" "$min_cann"; then
    problems="${problems}${problems:+; }CANN $cann is older than $min_cann"
  fi
  if [ -n "$problems" ]; then
    emit versions fail "$problems" "upgrade to driver >= $min_driver and CANN >= $min_cann (or set ascend-pd:preflight.minDriver/minCann)" "$data"
  elif [ -z "$cann" ]; then
    emit versions pass "driver $driver; no CANN toolkit on the host (the image's is used)" "" "$data"
  else
    emit versions pass "driver $driver, CANN $cann" "" "$data"
  fi
}

check_page_size() {
  local size
  size=$(getconf PAGE_SIZE 2>/dev/null) || size="?"
  if [ "$size" = 4096 ]; then
    emit page-size pass "4096-byte pages" "" "{\"bytes\":4096}"
  else
    emit page-size fail "getconf PAGE_SIZE is $size, not 4096 (a 64 KB-page kernel)" \
      "use the openYuanrong package built for 64 KB pages (ascend-pd:yuanrong.package) or a 4 KB-page kernel" \
      "{\"bytes\":$(json_str "$size")}"
  fi
}

check_memory() {
  local total avail hp_total hp_size reserved need_more need shm=$shm_kib note=""
  read -r total avail hp_total hp_size < <(awk '
    /^MemTotal:/ {t=$2} /^MemAvailable:/ {a=$2} /^HugePages_Total:/ {h=$2} /^Hugepagesize:/ {s=$2}
    END {print t+0, a+0, h+0, s+0}' /proc/meminfo)
  reserved=$((hp_total * hp_size))
  # A re-run: huge pages already reserved count as had, and while this stack's container runs, its
  # worker's shared memory is already taken out of MemAvailable.
  need_more=$((hugepages_kib > reserved ? hugepages_kib - reserved : 0))
  if [ "$stack_pids" != " " ] && [ "$shm" -gt 0 ]; then shm=0; note=" (this stack's worker already holds its shared memory)"; fi
  need=$((need_more + shm))
  local data="{\"mem_total_kib\":$total,\"mem_available_kib\":$avail,\"hugepages_kib\":$reserved}"
  if [ "$need" -gt "$avail" ]; then
    emit memory fail "needs $((need / 1048576)) GiB more (huge pages $((hugepages_kib / 1048576)) GiB, $((reserved / 1048576)) GiB reserved; worker shared memory $((shm / 1048576)) GiB) but MemAvailable is $((avail / 1048576)) GiB" \
      "free memory on the node or lower ascend-pd:hugepages.gib / yuanrong.sharedMemoryMb" "$data"
  elif [ "$total" -lt "$min_total_kib" ]; then
    # What the stack needs fits, so this does not fail: the guides' figure is for their own models and pools.
    emit memory warn "MemTotal is $((total / 1048576)) GiB, below the $((min_total_kib / 1048576)) GiB the $hardware guide assumes ($((avail / 1048576)) GiB available, $((need / 1048576)) GiB more needed)" \
      "add RAM, or set ascend-pd:preflight.minHostMemoryGib to this node's size (0: no such warning) if the model fits" "$data"
  else
    emit memory pass "$((avail / 1048576)) GiB available of $((total / 1048576)) GiB; needs $((need / 1048576)) GiB more$note" "" "$data"
  fi
}

check_npu() {
  if ! npu-smi info > "$tmp/npu" 2> "$tmp/npu.err"; then
    emit npu fail "npu-smi info failed: $(head -c 200 "$tmp/npu.err")" "install the driver and check /dev/davinci*" "{}"
    return
  fi
  # npu-smi info: NPU rows "| id name | health | ...", chip rows "| id [phy] | bus-id | ...",
  # process rows "| npu chip | pid | name | MB |" (one column more).
  local chips unhealthy problems=""
  chips=$(awk -F'|' 'NF == 5 && $3 ~ /^ *[0-9A-Fa-f]+:[0-9A-Fa-f]+:/ {n++} END {print n+0}' "$tmp/npu")
  unhealthy=$(awk -F'|' 'NF == 5 {split($2, w, " "); h=$3; gsub(/ /, "", h)}
    NF == 5 && w[1] ~ /^[0-9]+$/ && w[2] ~ /[A-Za-z]/ && h != "OK" {printf "NPU %s %s; ", w[1], h}' "$tmp/npu")
  if [ "$chips" -ne "$npus" ]; then problems="npu-smi shows $chips NPU chips, the plan needs $npus; "; fi
  problems="$problems$unhealthy"
  local npu chip pid name mb held="" mine=0
  while read -r npu chip pid name mb; do
    if ours "$pid"; then mine=$((mine + 1)); else held="${held}NPU $npu chip $chip: pid $pid ($name, $mb MB); "; fi
  done < <(awk -F'|' 'NF == 6 {split($2, w, " "); p=$3; gsub(/ /, "", p); n=$4; gsub(/ /, "", n); m=$5; gsub(/ /, "", m)}
    NF == 6 && p ~ /^[0-9]+$/ {print w[1], w[2], p, n, m}' "$tmp/npu")
  if [ -n "$held" ]; then
    emit npu fail "${problems}held by a process that is not this stack's: ${held%; }" \
      "stop the leftover process (kill the pid, or docker rm -f its container) before deploying" "{\"chips\":$chips}"
  elif [ -n "$problems" ]; then
    emit npu fail "${problems%; }" "check the NPUs (npu-smi info -t health -i N), reset or replace the failed one" "{\"chips\":$chips}"
  else
    local ourn=""
    if [ "$mine" -gt 0 ]; then ourn=" ($mine processes of this stack)"; fi
    emit npu pass "$chips NPU chips healthy, no foreign process$ourn" "" "{\"chips\":$chips}"
  fi
}

check_fabric() {
  if [ ! -f /etc/hccn.conf ]; then
    emit hccn-conf fail "/etc/hccn.conf is missing (the Mooncake transport reads it; it is mounted into the container)" \
      "configure the NPU NICs (hccn_tool -i N -ip -s address ... netmask ...), which writes /etc/hccn.conf" "{}"
    return
  fi
  local dev missing=""
  for ((dev = 0; dev < npus; dev++)); do
    grep -q "^address_$dev=" /etc/hccn.conf || missing="$missing $dev"
  done
  if [ -n "$missing" ]; then
    emit hccn-conf fail "/etc/hccn.conf has no address_N for NPU$missing" "set the NPU IPs with hccn_tool -i N -ip -s address A netmask M" "{}"
  else
    emit hccn-conf pass "/etc/hccn.conf lists $npus NPU addresses" "" "{}"
  fi
  for ((dev = 0; dev < npus; dev++)); do
    {
      hccn_tool -i "$dev" -link -g > "$tmp/link.$dev" 2>&1 || true
      hccn_tool -i "$dev" -net_health -g > "$tmp/health.$dev" 2>&1 || true
      hccn_tool -i "$dev" -ip -g > "$tmp/ip.$dev" 2>&1 || true
      if [ "$hardware" = a3 ]; then hccn_tool -i "$dev" -vnic -g > "$tmp/vnic.$dev" 2>&1 || true; fi
    } &
  done
  wait
  local link health ip conf vnic problems="" ips="" vnics=""
  for ((dev = 0; dev < npus; dev++)); do
    link=$(first_value "$tmp/link.$dev" "link status:")
    health=$(first_value "$tmp/health.$dev" "net health status:")
    ip=$(first_value "$tmp/ip.$dev" "ipaddr:")
    conf=$(first_value /etc/hccn.conf "address_$dev=")
    [ "$link" = UP ] || problems="${problems}NPU $dev link ${link:-unknown}; "
    [ "$health" = Success ] || problems="${problems}NPU $dev net_health ${health:-unknown}; "
    if [ -n "$conf" ] && [ "$ip" != "$conf" ]; then
      problems="${problems}NPU $dev has IP ${ip:-none} but /etc/hccn.conf says address_$dev=$conf; "
    fi
    ips="$ips${ips:+,}$(json_str "$ip")"
    if [ "$hardware" = a3 ]; then
      vnic=$(first_value "$tmp/vnic.$dev" "vnic ipaddr:")
      [ -n "$vnic" ] || problems="${problems}NPU $dev has no vNIC address; "
      vnics="$vnics${vnics:+,}$(json_str "$vnic")"
    fi
  done
  local data="{\"ips\":[$ips],\"vnics\":[$vnics]}"
  if [ -n "$problems" ]; then
    emit fabric fail "${problems%; }" "bring the link up and fix the address (hccn_tool -i N -ip -s ...), so the NPU IP and /etc/hccn.conf agree" "$data"
  else
    emit fabric pass "$npus NPU links up, healthy, IPs match /etc/hccn.conf" "" "$data"
  fi
}

check_ports() {
  ss -Hltnp > "$tmp/ss" 2>/dev/null || ss -Hltn > "$tmp/ss" 2>/dev/null || true
  local entry port owner line pid pname taken="" mine=0
  for entry in $ports; do
    port=${entry%%/*}
    owner=${entry#*/}
    line=$(awk -v p="$port" '{n=split($4, a, ":"); if (a[n] == p) {print; exit}}' "$tmp/ss")
    [ -n "$line" ] || continue
    pid=$(sed -n 's/.*pid=\([0-9]*\).*/\1/p;T;q' <<< "$line")
    pname=$(sed -n 's/.*users:(("\([^"]*\)".*/\1/p;T;q' <<< "$line")
    if [ -n "$pid" ] && ours "$pid"; then mine=$((mine + 1)); continue; fi
    taken="${taken}$port ($owner) by ${pname:-?} pid ${pid:-?}; "
  done
  # A port inside the kernel's ephemeral range can be taken by any outgoing connection before its
  # rank binds it (the rank then fails with Address already in use): a3's Mooncake side channels
  # (36000+, above AscendDirect's 20000-35999) are inside Linux's default 32768-60999.
  local lo=1 hi=0 reserved exposed
  read -r lo hi < /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
  reserved=$(cat /proc/sys/net/ipv4/ip_local_reserved_ports 2>/dev/null || true)
  exposed=$(for entry in $ports; do echo "${entry%%/*}"; done | sort -n | awk -v lo="$lo" -v hi="$hi" -v r="$reserved" '
    function rng() { return first == end ? first : first "-" end }
    BEGIN { n = split(r, parts, ","); for (i = 1; i <= n; i++) { m = split(parts[i], b, "-"); rlo[i] = b[1] + 0; rhi[i] = (m > 1 ? b[2] : b[1]) + 0 } }
    { p = $1 + 0; if (p < lo || p > hi) next
      for (i = 1; i <= n; i++) if (p >= rlo[i] && p <= rhi[i]) next
      if (have && p == end + 1) { end = p; next }
      if (have) { out = out sep rng(); sep = "," }
      first = p; end = p; have = 1 }
    END { if (have) out = out sep rng(); print out }')
  if [ -n "$taken" ]; then
    emit ports fail "taken: ${taken%; }" "stop what holds them, or move the stack's ports (the setting named in parentheses)" "{}"
  elif [ -n "$exposed" ]; then
    emit ports warn "ports $exposed are inside the kernel's ephemeral range $lo-$hi and not reserved: an outgoing connection can take one before its rank binds it" \
      "sysctl -w net.ipv4.ip_local_reserved_ports=${reserved:+$reserved,}$exposed, and persist it in /etc/sysctl.d" "{}"
  else
    local ourn=""
    if [ "$mine" -gt 0 ]; then ourn=" ($mine held by this stack)"; fi
    emit ports pass "$(wc -w <<< "$ports") ports free$ourn" "" "{}"
  fi
}

check_weights() {
  if [ ! -d "$model_path" ]; then
    emit weights fail "model path $model_path does not exist" "copy the weights to $model_path on this node (ascend-pd:model.path)" "{}"
    return
  fi
  find "$model_path" -type f -printf '%P\t%s\n' 2>/dev/null | sort > "$tmp/files" || true
  local count bytes digest files stray
  count=$(wc -l < "$tmp/files")
  bytes=$(awk -F'\t' '{s += $2} END {printf "%d", s}' "$tmp/files")
  digest=$(sha256sum < "$tmp/files" | cut -c1-16)
  files=$(head -n 4000 "$tmp/files" | awk -F'\t' '{gsub(/\\/, "\\\\", $1); gsub(/"/, "\\\"", $1); printf "%s[\"%s\",%s]", (NR > 1 ? "," : ""), $1, $2}')
  local data="{\"count\":$count,\"bytes\":$bytes,\"digest\":\"$digest\",\"files\":[$files]}"
  stray=$(awk -F'\t' '$1 ~ /(^|\/)rot\.safetensors$/ && n++ < 3 {printf "%s ", $1}' "$tmp/files")
  if [ "$count" -eq 0 ]; then
    emit weights fail "$model_path holds no files" "copy the weights to $model_path on this node" "$data"
  elif [ -n "$stray" ]; then
    emit weights fail "$model_path holds ${stray% } (vLLM then fails with KeyError: 'rot')" "move rot.safetensors out of the weights directory" "$data"
  else
    emit weights pass "$count files, $((bytes / 1048576)) MiB (listing $digest)" "" "$data"
  fi
}

check_docker() {
  local server problems="" image_state free
  if ! server=$(docker version --format '{{.Server.Version}}' 2>"$tmp/docker.err"); then
    emit docker fail "docker does not answer: $(head -c 160 "$tmp/docker.err" | tr '\n' ' ')" \
      "install docker and let the SSH user run it (usermod -aG docker, or log in as root)" "{}"
    return
  fi
  if docker image inspect --format '{{.Id}}' "$image" > /dev/null 2>&1; then
    image_state="on the node"
  else
    local code
    code=$(curl -sS -o /dev/null -w '%{http_code}' --connect-timeout 5 -m 10 "https://$registry/v2/" 2>/dev/null) || code=000
    if [ "$code" = 000 ]; then
      problems="image $image is not on the node and registry $registry does not answer; "
    fi
    image_state="to be pulled from $registry"
  fi
  free=$(df -Pk /var/lib/docker 2>/dev/null | awk 'NR == 2 {print $4}') || free=""
  if [ -n "$free" ] && [ "$free" -lt "$min_free_disk_kib" ]; then
    problems="${problems}/var/lib/docker has $((free / 1048576)) GiB free, needs $((min_free_disk_kib / 1048576)) GiB; "
  fi
  if [ -n "$problems" ]; then
    emit docker fail "${problems%; }" "docker pull the image on the node (or open the registry, via the container's https_proxy), and free disk" "{}"
  else
    emit docker pass "docker $server, image $image_state, $((${free:-0} / 1048576)) GiB free" "" "{}"
  fi
}

check_network() {
  local url code bad="" warn=""
  for url in $urls $optional_urls; do
    code=$(curl -sS -o /dev/null -w '%{http_code}' --connect-timeout 5 -m 15 -r 0-0 "$url" 2>/dev/null) || code=000
    case "$code" in
      2??|3??) ;;
      *) case " $optional_urls " in
           *" $url "*) warn="${warn}$url (HTTP $code); " ;;
           *) bad="${bad}$url (HTTP $code); " ;;
         esac ;;
    esac
  done
  if [ -n "$bad" ]; then
    emit network fail "unreachable from the node: ${bad%; }" "open the node's internet access or set https_proxy in ascend-pd:container.env" "{}"
  elif [ -n "$warn" ]; then
    emit network warn "unreachable: ${warn%; } (needed only if the image lacks etcd)" "set ascend-pd:etcd.binary to an etcd in the image, or open access" "{}"
  else
    emit network pass "$(wc -w <<< "$urls $optional_urls") download URLs reachable" "" "{}"
  fi
}

check_firewall() {  # nft can load ascend-pd's table; a deployed node whose table is gone is a warning
  local out rc dropped running
  if [ -z "$firewall_table" ]; then
    emit firewall pass "ascend-pd:firewall.enabled is false: no table to load" "" "{}"
    return
  fi
  if ! command -v nft > /dev/null 2>&1; then
    emit firewall fail "nft is missing: the node's firewall (ascend-pd:firewall) cannot be loaded" \
      "install nftables on the node (apt-get install nftables, or dnf install nftables), or set ascend-pd:firewall.enabled: false" "{}"
    return
  fi
  out=$(nft list tables 2>&1) && rc=0 || rc=$?
  if [ "$rc" != 0 ]; then
    emit firewall fail "nft cannot read the ruleset: $(head -n 1 <<< "$out" | head -c 160)" \
      "log in as root (ascend-pd:ssh.user): loading the table needs CAP_NET_ADMIN" "{}"
  elif grep -qx "table inet $firewall_table" <<< "$out"; then
    dropped=$(nft list table inet "$firewall_table" 2>/dev/null |
      sed -n 's/.*counter packets \([0-9]*\) bytes [0-9]* drop.*/\1/p' | head -n 1)
    emit firewall pass "table inet $firewall_table loaded; ${dropped:-an unknown number of} packet(s) from outside the cluster dropped" "" "{}"
  else
    running=$(docker inspect --format '{{.State.Running}}' "${containers%% *}" 2>/dev/null) || running=""
    if [ "$running" = true ]; then
      emit firewall warn "container ${containers%% *} runs but table inet $firewall_table is not loaded: every port is open" \
        "pulumi refresh, then pulumi up, loads it again" "{}"
    else
      emit firewall pass "nft ready; table inet $firewall_table not loaded yet (pulumi up loads it before anything listens)" "" "{}"
    fi
  fi
}
check_clock
check_versions
check_page_size
load_stack_pids
check_memory
check_npu
check_fabric
check_ports
check_weights
check_docker
check_network
check_firewall
finish
