"""The vLLM ranks of one node: one launch script per node (a node serves at most one DP instance).

The launch owns every rank on its node:
* ranks the plan no longer places on this node, whatever instance they belonged to (a topology
  change renames instances and moves nodes between them), are stopped first: they hold the ports
  and NPUs the planned ranks need, and Pulumi deletes a removed resource only after every create
  and update of the run has succeeded;
* a DP group restarts as a whole: every rank's command fingerprint includes the fingerprint of the
  whole group (every rank's command on every node), so a change anywhere in the group restarts it
  everywhere; and running ranks are kept only while every rank of the group answers /health (a
  group that lost a member cannot take a restarted one back);
* it waits until its ranks answer /health, and fails fast when one of them dies, or when the
  launch of another node of the group reports failure in etcd (instead of waiting out
  `vllm.readyTimeoutS` for ranks that will never come).

Its delete drains the instance first when the proxy still lists it: the delete is then the first
half of a replacement of the node's container (`prefill.image`, `decode.image`) in a cluster that
serves on, and it keeps one of the role's restart slots until the new container's launch serves
(shell/rollout_lib.sh). A destroy (the proxy goes first) and a removed node just stop the ranks.
"""

from __future__ import annotations

import json

from ..plan import ROLLOUT_FAILED, UNSET_ENV, Instance, Plan, restart_bound_s, role_secrets_file, rollout_prefix
from ..valuetypes import BASH_SECONDS_MAX
from ..shell import (CURL, LOG_TAIL, Script, background, fingerprint, header, library, managed_start, params, q,
                     source_env_files)

POLL_S = 5
ROLLOUT_MARGIN_S = 60  # a restart slot's lease outlives stop + drain + ready by this
ONE_REQUEST_TIMEOUT_S = 60  # the one-token completion on a restarted rank
READD_TIMEOUT_S = 60  # until the proxy lists a restarted instance again (it re-checks a parked one itself)
# How often a restarting instance's removal from the proxy is re-asserted. The release's script resets
# it whenever one of the instance's earlier requests is released and sends it requests until then;
# each call costs the proxy an HTTP client per endpoint (23 ms measured), so not more often.
RETAINT_S = 0.25
# Under ascend-pd:proxy.keepRemovedOut the removal holds by itself (shell/pd_proxy_launch.py): it is
# re-asserted only in case the proxy restarted from its argv, which lists every instance.
RETAINT_KEPT_S = 5.0
# How long a launch asks a proxy that answers slowly, or with an error, before it restarts its instance
# without taking it out first (rollout_lib.sh proxy_call_patient): two more 5 s calls. Seen under load:
# one call past its 5 s while the proxy had answered the call just before.
PROXY_PATIENCE_S = 10
DRAIN_QUIET_POLLS = 4  # idle polls in a row (0.5 s apart) before an instance counts as drained
PROGRESS_EVERY_S = 60  # a progress line while waiting: long waits are visible, stdout stays small
GROUP_KEY_PREFIX = "/ascend-pd/launch"  # etcd prefix of the launch states of multi-node groups


def group_fingerprint(instance: Instance) -> str:
    """Every rank's command and environment in the group: what a rank's restart decision covers.
    (Not the node names: renaming a node changes no process.)"""
    return fingerprint(*(json.dumps([r.argv, r.env]) for r in instance.ranks))



def group_key(plan: Plan, instance: Instance) -> str:
    return f"{GROUP_KEY_PREFIX}/{plan.stack}/{instance.name}/"


def launch(plan: Plan, instance: Instance, node: str) -> Script:
    ranks = instance.ranks_on(node)
    cfg = plan.cfg
    multi_node = len(instance.nodes) > 1
    group = group_fingerprint(instance)
    pidfiles = [f"{plan.run_dir}/{r.name}.pid" for r in ranks]
    top = header(plan.stack, node, f"{instance.name} ranks {', '.join(r.name for r in ranks)}",
                 converge=cfg.converge) + params(
        node=node, instance=instance.name, run_dir=plan.run_dir, log_dir=plan.log_dir,
        grace=cfg.vllm.stop_timeout_s, ready_timeout_s=cfg.vllm.ready_timeout_s, log_tail=LOG_TAIL,
        planned=" " + " ".join(r.name for r in ranks) + " ",
        **({"etcd_url": plan.etcd.client_url, "group_key": group_key(plan, instance)} if multi_node else {}),
    ) + f"local_pidfiles=({' '.join(q(p) for p in pidfiles)})\n"
    starts, current, processes = [], [], []
    for r in ranks:
        log = f"{plan.log_dir}/{r.name}.log"
        start = background(r.argv, log, env=r.env, unset=UNSET_ENV, head=3)
        spec = fingerprint(start, group)
        processes.append((r.name, spec))
        starts.append(f"# {r.name}: DP rank {r.dp_rank}/{r.dp_size}, devices {r.visible_devices}, port {r.port}\n"
                      + managed_start(r.name, plan.run_dir, log, start, cfg.vllm.stop_timeout_s, spec=spec))
        current.append(f"running_with {q(f'{plan.run_dir}/{r.name}.pid')} {spec} || changed=1")
    ro = cfg.rollout
    same_role = len(plan.instances_of(instance.role))
    slots = plan.max_unavailable(instance.role)
    slot_ttl = restart_bound_s(cfg) + ROLLOUT_MARGIN_S
    rollout = params(
        proxy_url=plan.proxy.url, proxy_type=instance.role, spares=same_role - 1,
        retaint_s=RETAINT_KEPT_S if cfg.proxy.keep_removed_out else RETAINT_S, proxy_patience_s=PROXY_PATIENCE_S,
        drain_quiet_polls=DRAIN_QUIET_POLLS, drain_timeout_s=ro.drain_timeout_s,
        slots=slots, slot_ttl_s=slot_ttl,
        # Every other instance of the role may go first, one slot-time each.
        slot_timeout_s=min(BASH_SECONDS_MAX, slot_ttl * max(1, -(-(same_role - 1) // slots))),
        slot_prefix=rollout_prefix(plan.stack, instance.role),
        failed_key=rollout_prefix(plan.stack, instance.role) + ROLLOUT_FAILED,
        readd_timeout_s=READD_TIMEOUT_S,
        lead=int(node == instance.nodes[0]),
    )
    check = params(one_request=json.dumps({"model": cfg.model.served_name, "prompt": "ping", "max_tokens": 1}),
                   first_rank=f"http://{ranks[0].address}:{ranks[0].port}")
    endpoint_arrays = (f"endpoints=({' '.join(q(f'{r.address}:{r.port}') for r in instance.ranks)})\n"
         f"local_endpoints=({' '.join(q(f'{r.address}:{r.port}') for r in ranks)})\n"
         f"metrics_urls=({' '.join(q(f'{r.url}/metrics') for r in instance.ranks)})\n")
    group_urls = " ".join(q(f"{r.url}/health") for r in instance.ranks)
    checks = "\n  ".join(f"check_rank {q(r.name)} {q(f'{r.url}/health')} && healthy=$((healthy + 1))"
                         for r in ranks)
    create = top + rollout + check + ("" if multi_node else params(etcd_url=plan.etcd.client_url)) + endpoint_arrays \
        + source_env_files(cfg.container.env_files) \
        + library("lib", "rollout_lib", *(["group_lib"] if multi_node else [])) + f"""
mkdir -p "$run_dir" "$log_dir"
# A slot this instance holds from the delete in its old container, given back once it serves again.
slot_key=""
slot_held
# Ranks on this node that the plan no longer has, from any instance: they hold ports and NPUs.
unplanned=()
for pidfile in "$run_dir"/prefill-*-r*.pid "$run_dir"/decode-*-r*.pid; do
  [ -e "$pidfile" ] || continue
  case "$planned" in *" $(basename "$pidfile" .pid) "*) ;; *)
    echo "$(basename "$pidfile" .pid): no longer planned on $node: stopping it"
    unplanned+=("$pidfile") ;;
  esac
done
if [ "${{#unplanned[@]}}" -gt 0 ]; then stop_pidfiles "$grace" "${{unplanned[@]}}"; fi

# A DP group restarts as a whole: keep this node's ranks only while every rank of the group answers.
group_healthy() {{
  local url
  for url in {group_urls}; do {CURL} -fsS -o /dev/null -m 3 "$url" 2>/dev/null || return 1; done
}}
running=0 changed=0 rollout=0
for pidfile in "${{local_pidfiles[@]}}"; do if pid_of "$pidfile" >/dev/null; then running=1; fi; done
{chr(10).join(current)}
if [ "$running" = 1 ] && ! group_healthy; then
  echo "$instance: not every rank of the group answers /health: restarting this node's ranks"
  if out_of_proxy; then rollout=1; fi  # broken: nothing to drain
  stop_pidfiles "$grace" "${{local_pidfiles[@]}}"
elif [ "$running" = 1 ] && [ "$changed" = 1 ]; then
  # A serving instance restarts: one slot of its role, out of the proxy, drained, then stopped.
  echo "$instance: its ranks' commands changed: restarting its ranks on $node"
  slot_acquire restart
  if out_of_proxy serving; then rollout=1; drain; fi
  stop_pidfiles "$grace" "${{local_pidfiles[@]}}"
elif [ "$running" = 0 ] && out_of_proxy; then
  rollout=1  # dead ranks the proxy still routes to: out until they answer again
fi
{"group_put starting launching" + chr(10) + "started_at=$(date +%s)" + chr(10) if multi_node else ""}

fail() {{  # fail MESSAGE: stop this node's ranks, tell the group, exit 1
  echo "$instance on $node: $1" >&2
  {'group_put failed "$1"' if multi_node else ':'}
  stop_pidfiles "$grace" "${{local_pidfiles[@]}}"
  # A serving instance that does not come back keeps its slot, and the role's other restarts
  # waiting for one stop: the instance stays out of the proxy (it does not serve) until it runs again.
  if [ -n "$slot_key" ]; then rollout_failed_mark; fi
  exit 1
}}
check_rank() {{  # check_rank NAME URL: 0 healthy, 1 not yet; a dead rank fails the launch
  if ! pid_of "$run_dir/$1.pid" >/dev/null; then
    show_log "$log_dir/$1.log"
    fail "$1 (pid $(cat "$run_dir/$1.pid" 2>/dev/null)) exited before answering /health"
  fi
  {CURL} -fsS -o /dev/null -m 3 "$2" 2>/dev/null
}}

{_secrets(plan, instance)}{chr(10).join(starts)}
# Wait until every local rank answers /health (the ranks of a DP group need all their peers up).
deadline=$((SECONDS + ready_timeout_s))
report=$((SECONDS + {PROGRESS_EVERY_S}))
while :; do
  healthy=0
  {checks}
  if [ "$healthy" -eq {len(ranks)} ]; then break; fi
{_peer_check() if multi_node else ""}  if [ "$SECONDS" -ge "$deadline" ]; then
    for pidfile in "${{local_pidfiles[@]}}"; do show_log "$log_dir/$(basename "$pidfile" .pid).log"; done
    fail "only $healthy of {len(ranks)} ranks healthy after ${{ready_timeout_s}}s"
  fi
  if [ "$SECONDS" -ge "$report" ]; then
    echo "$instance on $node: $healthy/{len(ranks)} ranks healthy after $SECONDS s"
    report=$((SECONDS + {PROGRESS_EVERY_S}))
  fi
  sleep {POLL_S}
done
{"group_put ready healthy" + chr(10) if multi_node else ""}echo "$instance on $node: {len(ranks)}/{len(ranks)} ranks healthy"
if [ "$rollout" = 1 ]; then
  # One request on this node's first rank before the proxy sends it traffic again.
  if ! {CURL} -fsS -o /dev/null -m {ONE_REQUEST_TIMEOUT_S} -H 'Content-Type: application/json' \\
      -d "$one_request" "$first_rank/v1/completions"; then
    fail "no completion from $first_rank after the restart: left out of the proxy"
  fi
  if ! into_proxy "${{local_endpoints[@]}}"; then
    fail "not taken back by the proxy: left out of it (the next pulumi up, or heal, starts it again)"
  fi
fi
rollout_served
slot_release
"""
    delete = header(plan.stack, node, "vLLM ranks (stop)") + params(
        node=node, instance=instance.name, run_dir=plan.run_dir, grace=cfg.vllm.stop_timeout_s, log_tail=LOG_TAIL,
        etcd_url=plan.etcd.client_url,
    ) + f"local_pidfiles=({' '.join(q(p) for p in pidfiles)})\n" + rollout + endpoint_arrays \
        + library("lib", "rollout_lib") + """
# Ranks that serve while the proxy still lists them: this delete is the first half of a replacement
# (a new image or container for this node) in a cluster that serves on. A destroy deletes the proxy
# first, a removed node is out of the proxy's argv by now: they just stop. Drained as a restart is,
# holding one of the role's restart slots until the new container's launch has the instance back.
slot_key=""
running=0
for pidfile in "${local_pidfiles[@]}"; do if pid_of "$pidfile" >/dev/null; then running=1; fi; done
if [ "$running" = 1 ] && proxy_lists "${local_endpoints[@]}"; then
  echo "$instance: stopping on $node while it serves (its container is replaced): draining it first"
  slot_acquire delete
  if out_of_proxy serving; then drain; fi
fi
# Every rank this node runs, whatever instance an older plan gave it.
stop_pidfiles "$grace" "$run_dir"/prefill-*-r*.pid "$run_dir"/decode-*-r*.pid
echo "ranks on $node stopped"
"""
    return Script("launch", node, "container", create, delete, identity=(plan.state_dir,),
                  processes=tuple(processes))


def _secrets(plan: Plan, instance: Instance) -> str:
    """The role's secret variables, exported from the file the program delivered (never on a command line)."""
    names = instance.ranks[0].secret_env
    if not names:
        return ""
    path = role_secrets_file(plan.cfg, instance.role)
    return params(secrets_file=path) + f"""secret_names=({' '.join(q(n) for n in names)})
if [ ! -r "$secrets_file" ]; then
  fail "$secrets_file is missing: pulumi up writes it (<node>-secrets) from the stack's secret variables"
fi
set -a
# shellcheck disable=SC1090  # the role's secret variables, NAME='value' lines written by the program
. "$secrets_file"
set +a
for name in "${{secret_names[@]}}"; do
  if [ -z "${{!name+x}}" ]; then fail "$secrets_file does not set $name: run pulumi up again"; fi
done
"""


def _peer_check() -> str:
    return """  if peer=$(group_failed_peer "$started_at"); then
    fail "the launch on ${peer%% *} failed (${peer#* }): stopping here too"
  fi
"""
