"""The openYuanrong Datasystem worker of a node (the external KV cache pool), started by `dscli start`.

A running worker is kept when it runs with the same flags and is registered in etcd; otherwise it
is (re)started: an etcd that restarted empty has lost the registration, and the worker must join
again for the pool to find it. The script names the etcd it registers in (`EtcdPlan.identity`): a
change that makes a new, empty etcd (its data dir, its ports, image mode) therefore changes every
worker's script, and the update that follows restarts the worker into the new etcd.

An etcd replaced with the same identity (its node's container replaced, by a role's image) changes no
script; the worker's create follows etcd's resource id instead and runs again with the new id in
$ASCEND_PD_FOLLOWS (shell.in_container). A worker that joined another etcd restarts even when it
finds itself registered: measured on the real engine, workers that had re-registered on their own
into the new etcd were unregistered again afterwards (3 of 4, twice), and a restart is what `heal`
did to repair them. Outside Pulumi (heal, a script run by hand) the variable is empty and the
check is skipped; a worker of a release before this file was kept adopts the current etcd.
"""

from __future__ import annotations

from ..plan import UNSET_ENV, Plan
from ..shell import FOLLOWS_ENV, LOG_TAIL, Script, command, fingerprint, header, library, params, source_env_files

WORKER_KILL_GRACE_S = 15  # after dscli stop gave up: TERM, then KILL after this
WORKER_RETRY_PAUSE_S = 5  # between a worker killed while starting and the next dscli start
LIVENESS_WAIT_S = 30  # from `dscli start` returning to the first successful liveness file


def worker(plan: Plan, node: str) -> Script:
    w = plan.worker(node)
    y = plan.cfg.yuanrong
    # `env -u ... dscli start -t N [numactl opts] -w`, then one worker flag per line. Started
    # without proxy variables: the worker's gRPC etcd client honours http_proxy.
    start = command(w.argv, head=w.argv.index("-w") + 1, unset=UNSET_ENV)
    spec = fingerprint(start)
    # Its create and delete name the same files: the running spec, and the etcd it joined.
    files = dict(specfile=f"{plan.run_dir}/worker.spec", joinedfile=f"{plan.run_dir}/worker.etcd")
    log = f"{plan.log_dir}/dscli-start.log"
    top = params(
        address=w.address, workdir=w.workdir, run_dir=plan.run_dir, log_dir=plan.log_dir,
        **files, log=log, worker_log=w.log, liveness=y.liveness_path,
        etcd_url=plan.etcd.client_url, etcd_identity=plan.etcd.identity,
        stop_timeout_s=y.stop_timeout_s, start_timeout_s=y.start_timeout_s,
        start_attempts=y.start_attempts, log_tail=LOG_TAIL, worker_kill_grace_s=WORKER_KILL_GRACE_S,
    )
    create = header(plan.stack, node, f"openYuanrong worker {w.address}", converge=plan.cfg.converge) + top \
        + source_env_files(plan.cfg.container.env_files) + library("lib", "worker_lib") + f"""
mkdir -p "$run_dir" "$log_dir" "$workdir"
joined=${{{FOLLOWS_ENV}:-}}  # the id of the etcd resource this run follows (empty outside Pulumi)
same_etcd() {{ [ -z "$joined" ] || [ ! -e "$joinedfile" ] || [ "$(cat "$joinedfile")" = "$joined" ]; }}
if [ -n "$(worker_pids "$address")" ]; then
  if [ "$(cat "$specfile" 2>/dev/null)" = {spec} ] && same_etcd && registered "$etcd_url" "$address"; then
    if [ -n "$joined" ]; then echo "$joined" > "$joinedfile"; fi
    echo "worker $address: already running (pid $(worker_pids "$address" | tr '\\n' ' '))"
    exit 0
  fi
  if [ "$(cat "$specfile" 2>/dev/null)" = {spec} ] && ! same_etcd; then
    echo "worker $address: etcd $etcd_identity was replaced since it joined: restarting"
  elif [ "$(cat "$specfile" 2>/dev/null)" = {spec} ]; then
    echo "worker $address: not registered in etcd $etcd_identity: restarting"
  else
    echo "worker $address: running with older flags: restarting"
  fi
  stop_worker "$address" "$stop_timeout_s"
fi
rm -f "$specfile"
# dscli resolves ./datasystem (logs, rocksdb, uds) against the current directory: always the same one.
cd "$workdir"
rm -f "$liveness"
# dscli start returns once the worker is ready and kills it itself after -t seconds. stdin from
# /dev/null: the worker inherits it and must not hold (or read) the pipe this script arrives on.
attempt=1
until timeout $((start_timeout_s + 60)) {start.replace(chr(10), chr(10) + '  ')} \\
    > "$log" 2>&1 < /dev/null; do
  signal_worker KILL "$address" "$worker_kill_grace_s"
  # Killed by a signal while starting (dscli: "exited with code -9"): right after a restart the
  # worker's own etcd thread can SIGKILL it as it rejoins the pool (seen in 2 of ~135 restarts on
  # a loaded machine). A fresh start succeeds; anything else (a bad flag, a timeout) fails again.
  if [ "$attempt" -lt "$start_attempts" ] && grep -qs 'Worker exited with code -[0-9]' "$log"; then
    echo "worker $address: killed while starting (attempt $attempt of $start_attempts): starting again"
    mv -f "$log" "$log.$attempt"
    attempt=$((attempt + 1))
    sleep {WORKER_RETRY_PAUSE_S}
    continue
  fi
  {{
    echo "openYuanrong worker $address failed to start (dscli start -t $start_timeout_s, attempt $attempt of $start_attempts)"
    echo "--- dscli start ($log):"
    grep -vF '[INFO] Starting with numactl command:' "$log" | tail -n "$log_tail" || true
    echo "--- last warnings and errors of $worker_log:"
    grep -s ' | [WEF] | ' "$worker_log" | tail -n "$log_tail" || true
  }} >&2
  exit 1
done
deadline=$((SECONDS + {LIVENESS_WAIT_S}))
until grep -qs 'liveness check success' "$liveness"; do
  if [ "$SECONDS" -ge "$deadline" ]; then fail_with_log "$log" "worker $address never wrote a successful $liveness"; fi
  sleep 1
done
# The liveness file outlives its writer: only a worker still running counts as started.
if [ -z "$(worker_pids "$address")" ]; then
  fail_with_log "$worker_log" "worker $address exited right after it became ready"
fi
echo {spec} > "$specfile"
if [ -n "$joined" ]; then echo "$joined" > "$joinedfile"; fi
echo "worker $address: ready, registered with etcd $etcd_url"
"""
    delete = header(plan.stack, node, f"openYuanrong worker {w.address} (stop, clean)") + params(
        address=w.address, workdir=w.workdir, **files, liveness=y.liveness_path,
        stop_timeout_s=y.stop_timeout_s, worker_kill_grace_s=WORKER_KILL_GRACE_S, log_tail=LOG_TAIL) \
        + source_env_files(plan.cfg.container.env_files) + library("lib", "worker_lib") + """
cd "$workdir" 2>/dev/null || true
# Its files go only once it is gone (stop_worker fails the delete otherwise).
stop_worker "$address" "$stop_timeout_s"
# Stale rocksdb metadata and client logs cause 'key not found' after an unclean stop (seed FAQ).
rm -rf "$workdir/datasystem" "$HOME/.datasystem" "$liveness" "$specfile" "$joinedfile"
echo "worker $address: stopped and cleaned"
"""
    return Script("worker", node, "container", create, delete,
                  identity=(plan.state_dir, w.address, y.liveness_path), processes=(("worker", spec),))
