#!/usr/bin/env bash
# ascend-pd a3-4node: huge pages (500 GiB) on p1
set -euo pipefail

page_kib=$(awk '/^Hugepagesize:/ {print $2}' /proc/meminfo)
if [ -z "$page_kib" ]; then echo "/proc/meminfo has no Hugepagesize: this kernel has no huge pages" >&2; exit 1; fi
pages=$(( (500 * 1024 * 1024 + page_kib - 1) / page_kib ))
mkdir -p /var/lib/ascend-pd
# The count before ascend-pd first changed it, restored on delete.
first_run=0
if [ ! -f /var/lib/ascend-pd/nr_hugepages.before ]; then cat /proc/sys/vm/nr_hugepages > /var/lib/ascend-pd/nr_hugepages.before; first_run=1; fi
before=$(cat /proc/sys/vm/nr_hugepages)
if [ "$before" != "$pages" ]; then echo "$pages" > /proc/sys/vm/nr_hugepages; fi
total=$(awk '/^HugePages_Total:/ {print $2}' /proc/meminfo)
if [ "$total" -lt "$pages" ]; then
  available=$(awk '/^MemAvailable:/ {print $2 " " $3}' /proc/meminfo)
  echo "$before" > /proc/sys/vm/nr_hugepages  # back to what this run found
  if [ "$first_run" = 1 ]; then rm -f /var/lib/ascend-pd/nr_hugepages.before; fi
  echo "the kernel gave $total of $pages huge pages of $page_kib kB (500 GiB wanted); MemAvailable: $available." >&2
  echo "Free memory (or set vm.nr_hugepages at boot) and run again, or lower ascend-pd:hugepages.gib." >&2
  exit 1
fi
mkdir -p /etc/sysctl.d
echo "vm.nr_hugepages = $pages" > /etc/sysctl.d/90-ascend-pd-hugepages.conf
echo "huge pages on p1: $total x $page_kib kB"
