#!/usr/bin/env bash
# ascend-pd a2-8node: huge pages (restore) on p3
set -euo pipefail
node=p3
nr_hugepages=/proc/sys/vm/nr_hugepages
sysctl_file=/etc/sysctl.d/90-ascend-pd-hugepages.conf
state_file=/var/lib/ascend-pd/nr_hugepages.before

if [ -f "$state_file" ]; then
  cat "$state_file" > "$nr_hugepages"
  echo "vm.nr_hugepages restored to $(cat "$state_file") on $node"
  rm -f "$state_file"
fi
rm -f "$sysctl_file"
