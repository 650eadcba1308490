#!/usr/bin/env bash
# ascend-pd a2-8node: huge pages (500 GiB) on d0
set -euo pipefail
node=d0
gib=500
meminfo=/proc/meminfo
nr_hugepages=/proc/sys/vm/nr_hugepages
sysctl_file=/etc/sysctl.d/90-ascend-pd-hugepages.conf
state_file=/var/lib/ascend-pd/nr_hugepages.before

page_kib=$(awk '/^Hugepagesize:/ {print $2}' "$meminfo")
if [ -z "$page_kib" ]; then echo "$meminfo has no Hugepagesize: this kernel has no huge pages" >&2; exit 1; fi
pages=$(( (gib * 1024 * 1024 + page_kib - 1) / page_kib ))
mkdir -p "$(dirname "$state_file")"
# The count before ascend-pd first changed it, restored on delete.
first_run=0
if [ ! -f "$state_file" ]; then cat "$nr_hugepages" > "$state_file"; first_run=1; fi
before=$(cat "$nr_hugepages")
if [ "$before" != "$pages" ]; then echo "$pages" > "$nr_hugepages"; fi
total=$(awk '/^HugePages_Total:/ {print $2}' "$meminfo")
if [ "$total" -lt "$pages" ]; then
  available=$(awk '/^MemAvailable:/ {print $2 " " $3}' "$meminfo")
  echo "$before" > "$nr_hugepages"  # back to what this run found
  if [ "$first_run" = 1 ]; then rm -f "$state_file"; fi
  echo "the kernel gave $total of $pages huge pages of $page_kib kB ($gib GiB wanted); MemAvailable: $available." >&2
  echo "Free memory (or set vm.nr_hugepages at boot) and run again, or lower ascend-pd:hugepages.gib." >&2
  exit 1
fi
mkdir -p "$(dirname "$sysctl_file")"
echo "vm.nr_hugepages = $pages" > "$sysctl_file"
echo "huge pages on $node: $total x $page_kib kB"
