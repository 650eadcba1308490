"""etcd on the etcd node: the single member the openYuanrong workers register in.

Binary mode: started in the node's NPU container; every fresh start begins with an empty data dir
(stale member data makes a restart fail or resurrect old worker registrations, seed 000's FAQ),
while a running etcd with the same command is left alone. Image mode: docker runs etcd in its own
container (ascend_pd/components/etcd_single.py) and this script is only the health gate.
"""

from __future__ import annotations

from ..plan import UNSET_ENV, Plan
from ..shell import CURL, LOG_TAIL, Script, background, fingerprint, header, library, managed_start, params, q

STOP_GRACE_S = 30  # etcd stops in well under a second; this bounds a wedged one


def _health(client_url: str) -> str:
    return f"{CURL} -fsS -m 3 \"$client_url/health\" 2>/dev/null | grep -q '\"health\":\"true\"'"


def etcd(plan: Plan) -> Script:
    e, cfg = plan.etcd, plan.cfg.etcd
    if e.image is not None:
        return _gate(plan)
    pidfile, log = f"{plan.run_dir}/etcd.pid", f"{plan.log_dir}/etcd.log"
    top = header(plan.stack, e.node, f"etcd {e.endpoint}", converge=plan.cfg.converge) + params(
        run_dir=plan.run_dir, log_dir=plan.log_dir, pidfile=pidfile, log=log, data_dir=e.data_dir,
        client_url=e.client_url, start_timeout_s=cfg.start_timeout_s, log_tail=LOG_TAIL) + library("lib")
    start = background(e.argv, log, unset=UNSET_ENV)
    create = top + f"""
mkdir -p "$run_dir" "$log_dir"
if ! running_with "$pidfile" {fingerprint(start)}; then
  # A fresh start: the member data of an earlier run must not come back (seed 000's FAQ).
  stop_pidfiles {STOP_GRACE_S} "$pidfile"
  rm -rf "$data_dir"
  # Another etcd on these ports (not this script's) would answer the health check below for it.
  if {_health(e.client_url)}; then
    echo "an etcd this script did not start already answers at $client_url: stop it (an earlier" >&2
    echo "ascend-pd:etcd.image container, or a system etcd) so the planned one can bind its ports" >&2
    exit 1
  fi
fi
if ! command -v {q(e.argv[0])} > /dev/null 2>&1; then
  echo {q(f"etcd binary {e.argv[0]} is missing on {e.node}: set ascend-pd:etcd.binary to the etcd in the container")} >&2
  exit 1
fi
{managed_start("etcd", plan.run_dir, log, start, STOP_GRACE_S)}deadline=$((SECONDS + start_timeout_s))
until {_health(e.client_url)} && pid_of "$pidfile" >/dev/null; do
  if ! pid_of "$pidfile" >/dev/null; then fail_with_log "$log" "etcd exited before it became healthy"; fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    stop_pidfiles 10 "$pidfile"
    fail_with_log "$log" "etcd not healthy at $client_url/health within ${{start_timeout_s}}s"
  fi
  sleep 1
done
echo "etcd healthy at $client_url"
"""
    delete = header(plan.stack, e.node, "etcd (stop, remove data)") + params(
        pidfile=pidfile, data_dir=e.data_dir, log_tail=LOG_TAIL) + library("lib") + f"""
stop_pidfiles {STOP_GRACE_S} "$pidfile"
# Stale member data makes the next start fail or resurrect old worker registrations (seed FAQ).
rm -rf "$data_dir"
echo "etcd stopped, $data_dir removed"
"""
    return Script("etcd", e.node, "container", create, delete, identity=(plan.state_dir, e.data_dir),
                  processes=(("etcd", fingerprint(start)),))


def _gate(plan: Plan) -> Script:
    """Image mode: waits for etcd from the NPU container, which shares the host network and has
    curl (the etcd image is distroless)."""
    e, cfg = plan.etcd, plan.cfg.etcd
    where = f"container {e.container_name} ({e.image})"
    top = header(plan.stack, e.node, f"etcd {e.endpoint} in {where}: health gate", converge=plan.cfg.converge) + params(
        client_url=e.client_url, start_timeout_s=cfg.start_timeout_s, where=where, node=e.node,
        etcd_container=e.container_name)
    create = top + f"""
deadline=$((SECONDS + start_timeout_s))
until {_health(e.client_url)}; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "etcd in $where not healthy at $client_url/health within ${{start_timeout_s}}s" >&2
    echo "its log: docker logs $etcd_container (on $node)" >&2
    exit 1
  fi
  sleep 1
done
echo "etcd healthy at $client_url"
"""
    delete = header(plan.stack, e.node, "etcd health gate") + params(where=where) + """
# Destroying the etcd container removes etcd and its data with it.
echo "etcd in $where: removed with its container"
"""
    # The gate's delete runs first when etcd leaves image mode (a replacement, old delete first),
    # while the engine removes the etcd container itself only at the end of that run: stop it here,
    # on the host, so the binary etcd that replaces it finds its ports free.
    stop = (f"docker stop -t {STOP_GRACE_S} {q(e.container_name)} >/dev/null 2>&1 || true  "
            f"# free etcd's ports now; the container is removed at the end of the run\n")
    return Script("etcd", e.node, "container", create, delete, identity=(e.container_name,),
                  delete_on_host_first=stop)
