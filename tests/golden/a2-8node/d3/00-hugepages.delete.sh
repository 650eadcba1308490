#!/usr/bin/env bash
# ascend-pd a2-8node: huge pages (restore) on d3
set -euo pipefail

if [ -f /var/lib/ascend-pd/nr_hugepages.before ]; then
  cat /var/lib/ascend-pd/nr_hugepages.before > /proc/sys/vm/nr_hugepages
  echo "vm.nr_hugepages restored to $(cat /var/lib/ascend-pd/nr_hugepages.before) on d3"
  rm -f /var/lib/ascend-pd/nr_hugepages.before
fi
rm -f /etc/sysctl.d/90-ascend-pd-hugepages.conf
