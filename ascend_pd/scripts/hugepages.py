"""Huge pages on a node's host (not in the container): `vm.nr_hugepages` for the worker's shared memory."""

from __future__ import annotations

from ..plan import Plan
from ..shell import Script, header, params

# Where the host script keeps the count it found before its first change (restored on delete) and
# the sysctl file that makes the reservation survive a reboot.
STATE_FILE = "/var/lib/ascend-pd/nr_hugepages.before"
SYSCTL_FILE = "/etc/sysctl.d/90-ascend-pd-hugepages.conf"


def hugepages(
    plan: Plan,
    node: str,
    *,
    meminfo: str = "/proc/meminfo",
    nr_hugepages: str = "/proc/sys/vm/nr_hugepages",
    sysctl_file: str = SYSCTL_FILE,
    state_file: str = STATE_FILE,
) -> Script:
    """Pages = wanted GiB / Hugepagesize (2 MiB or 512 MiB); the previous count is kept and
    restored on delete (and on a failed create, so nothing stays half-configured)."""
    gib = plan.cfg.hugepages.gib
    top = header(plan.stack, node, f"huge pages ({gib} GiB)") + params(
        node=node, gib=gib, meminfo=meminfo, nr_hugepages=nr_hugepages, sysctl_file=sysctl_file,
        state_file=state_file)
    create = top + """
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
"""
    delete = header(plan.stack, node, "huge pages (restore)") + params(
        node=node, nr_hugepages=nr_hugepages, sysctl_file=sysctl_file, state_file=state_file) + """
if [ -f "$state_file" ]; then
  cat "$state_file" > "$nr_hugepages"
  echo "vm.nr_hugepages restored to $(cat "$state_file") on $node"
  rm -f "$state_file"
fi
rm -f "$sysctl_file"
"""
    return Script("hugepages", node, "host", create, delete)
