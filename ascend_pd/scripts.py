"""Shell text for every node, rendered from the plan: what runs, not how it gets there.

Each `Script` has a create and a delete text. Container scripts run inside the node's NPU container
(the components pipe them into `docker exec -i <container> bash -s`); host scripts run on the node.
Every script is strict (`set -euo pipefail`), idempotent and convergent (a second run with the same
text changes nothing; a run with changed text restarts what changed), bounds every wait, and on
failure prints the last lines of the relevant log. Values are literal so `pulumi preview --diff`
shows exactly what will run on which node.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass

from .config import PatchStep, PipStep, step_name
from .plan import UNSET_ENV, Instance, Plan

HEREDOC = "ASCEND_PD_SCRIPT"
LOG_TAIL = 50  # lines of a log shown when something fails
PROGRESS_EVERY_S = 60  # a progress line while waiting, so long waits are visible but stdout stays small
POLL_S = 5
# Every probe of a service this program started talks to a node address directly. Container env
# often carries http_proxy (ascend-pd:container.env, for pip): curl and urllib would send the probe
# to that proxy, never see the service healthy, and stop it at the deadline.
CURL = "curl --noproxy '*'"
WORKER_KILL_GRACE_S = 15  # after dscli stop gave up: TERM, then KILL after this
WORKER_RETRY_PAUSE_S = 5  # between a worker killed while starting and the next dscli start


@dataclass(frozen=True)
class Script:
    name: str  # stable identity: "worker", "launch-prefill-0", "prepare-1-pip"
    node: str
    where: str  # "host" or "container"
    create: str
    delete: str


def q(value: object) -> str:
    return shlex.quote(str(value))


def _env_value(value: str) -> str:
    """Double-quote an env value; `$NAME`/`${NAME}` stay references (as in the seeds'
    `LD_PRELOAD=...:$LD_PRELOAD`), made safe under `set -u`. Everything else is literal."""
    out, pos = [], 0
    for m in re.finditer(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))", value):
        out.append(re.sub(r'(["\\`$])', r"\\\1", value[pos : m.start()]))
        out.append("${%s:-}" % (m.group(1) or m.group(2)))
        pos = m.end()
    out.append(re.sub(r'(["\\`$])', r"\\\1", value[pos:]))
    return '"' + "".join(out) + '"'


def _spec(text: str) -> str:
    """Fingerprint of a start command: a running process with another fingerprint is restarted."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _header(plan: Plan, node: str, what: str, *, cann_env: bool = False) -> str:
    """Shebang, what and where, strict mode; with cann_env the container's CANN environment
    (ascend-pd:container.envFiles), sourced leniently: those scripts are not `set -u` clean."""
    text = f"#!/usr/bin/env bash\n# ascend-pd {plan.stack}: {what} on {node}\nset -euo pipefail\n"
    files = plan.cfg.container.env_files if cann_env else []
    if files:
        text += "# The environment an interactive shell in this container has (CANN's set_env.sh files).\nset +eu\n"
        text += "".join(f"# shellcheck source=/dev/null\nif [ -f {q(f)} ]; then . {q(f)}; fi\n" for f in files)
        text += "set -eu\n"
    return text


# Process bookkeeping shared by container scripts. Functions take paths, never commands: every
# command that starts something is written out literally where it runs.
LIB = r"""
alive() {  # alive PID: running and not a zombie
  local stat
  stat=$(sed -e 's/^.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
  [ "${stat%% *}" != Z ]
}
stop_pidfiles() {  # stop_pidfiles GRACE PIDFILE...: TERM every process group at once, KILL what is left after GRACE s
  local grace=$1 pidfile pid deadline waiting
  shift
  local pids=()
  for pidfile in "$@"; do
    if [ -s "$pidfile" ] && alive "$(cat "$pidfile")"; then
      pid=$(cat "$pidfile")
      pids+=("$pid")
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    fi
  done
  deadline=$((SECONDS + grace))
  while :; do
    waiting=""
    for pid in ${pids[@]+"${pids[@]}"}; do if alive "$pid"; then waiting="$waiting $pid"; fi; done
    if [ -z "$waiting" ] || [ "$SECONDS" -ge "$deadline" ]; then break; fi
    sleep 0.5
  done
  if [ -n "$waiting" ]; then echo "pid(s)$waiting ignored TERM for ${grace}s: KILL" >&2; fi
  # KILL every group regardless: children (engine cores) must not outlive their leader.
  for pid in ${pids[@]+"${pids[@]}"}; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  deadline=$((SECONDS + 10))
  for pid in ${pids[@]+"${pids[@]}"}; do
    while alive "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.5; done
  done
  for pidfile in "$@"; do rm -f "$pidfile" "${pidfile%.pid}.spec"; done
}
needs_start() {  # needs_start PIDFILE SPEC GRACE: 0 if it must (re)start, 1 if running with SPEC
  local pidfile=$1 spec=$2 grace=$3
  if [ -s "$pidfile" ] && alive "$(cat "$pidfile")"; then
    if [ "$(cat "${pidfile%.pid}.spec" 2>/dev/null)" = "$spec" ]; then
      echo "$(basename "${pidfile%.pid}"): already running (pid $(cat "$pidfile"))"
      return 1
    fi
    echo "$(basename "${pidfile%.pid}"): running with an older command: restarting"
    stop_pidfiles "$grace" "$pidfile"
  fi
  return 0
}
rotate_log() {  # keep the previous run's log beside the new one
  if [ -f "$1" ]; then mv -f "$1" "$1.1"; fi
}
fail_with_log() {  # fail_with_log LOG MESSAGE
  echo "$2" >&2
  echo "--- last lines of $1:" >&2
  tail -n __TAIL__ "$1" >&2 2>/dev/null || echo "(no log)" >&2
  exit 1
}
""".replace("__TAIL__", str(LOG_TAIL))


def _dirs(plan: Plan) -> tuple[str, str]:
    s = plan.cfg.state_dir
    return f"{s}/run", f"{s}/logs"


def _background(env: tuple[tuple[str, str], ...], argv: tuple[str, ...], log: str, unset=UNSET_ENV) -> str:
    """`setsid nohup env ... CMD > LOG &`: its own session and process group, so it outlives the
    `docker exec` that started it and can be stopped as a group; stdin/stdout detached, or the
    exec would wait on them."""
    parts = ["setsid nohup env"]
    parts += [" ".join(f"-u {u}" for u in unset)] if unset else []
    parts += [f"{k}={_env_value(v)}" for k, v in env]
    parts += [" ".join(q(a) for a in argv[:3])]
    rest = list(argv[3:])
    i = 0
    while i < len(rest):  # one flag (with its value) per line
        if rest[i].startswith("--") and i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            parts.append(f"{rest[i]} {q(rest[i + 1])}")
            i += 2
        else:
            parts.append(q(rest[i]))
            i += 1
    return " \\\n    ".join(parts) + f" \\\n    > {q(log)} 2>&1 < /dev/null &"


def _managed_start(name: str, run: str, log: str, start: str, grace: int) -> str:
    """Start `start` (a `_background` line) unless it already runs with the same command; a
    running process with an older command is stopped first. Leaves the pid in <run>/<name>.pid."""
    spec = _spec(start)
    pidfile = f"{run}/{name}.pid"
    return f"""if needs_start {q(pidfile)} {spec} {grace}; then
  rotate_log {q(log)}
  {start.replace(chr(10), chr(10) + '  ')}
  echo $! > {q(pidfile)}
  echo {spec} > {q(f"{run}/{name}.spec")}
  echo "{name}: started pid $(cat {q(pidfile)})"
fi"""


# ---------------------------------------------------------------------------------------------
# Huge pages (host)


def hugepages(
    plan: Plan,
    node: str,
    *,
    meminfo: str = "/proc/meminfo",
    nr_hugepages: str = "/proc/sys/vm/nr_hugepages",
    sysctl_file: str = "/etc/sysctl.d/90-ascend-pd-hugepages.conf",
    state_file: str = "/var/lib/ascend-pd/nr_hugepages.before",
) -> Script:
    """Pages = wanted GiB / Hugepagesize (2 MiB or 512 MiB); the previous count is kept and
    restored on delete (and on a failed create, so nothing stays half-configured)."""
    gib = plan.cfg.hugepages.gib
    create = _header(plan, node, f"huge pages ({gib} GiB)") + f"""
page_kib=$(awk '/^Hugepagesize:/ {{print $2}}' {q(meminfo)})
if [ -z "$page_kib" ]; then echo "{meminfo} has no Hugepagesize: this kernel has no huge pages" >&2; exit 1; fi
pages=$(( ({gib} * 1024 * 1024 + page_kib - 1) / page_kib ))
mkdir -p {q(state_file.rsplit('/', 1)[0])}
# The count before ascend-pd first changed it, restored on delete.
first_run=0
if [ ! -f {q(state_file)} ]; then cat {q(nr_hugepages)} > {q(state_file)}; first_run=1; fi
before=$(cat {q(nr_hugepages)})
if [ "$before" != "$pages" ]; then echo "$pages" > {q(nr_hugepages)}; fi
total=$(awk '/^HugePages_Total:/ {{print $2}}' {q(meminfo)})
if [ "$total" -lt "$pages" ]; then
  available=$(awk '/^MemAvailable:/ {{print $2 " " $3}}' {q(meminfo)})
  echo "$before" > {q(nr_hugepages)}  # back to what this run found
  if [ "$first_run" = 1 ]; then rm -f {q(state_file)}; fi
  echo "the kernel gave $total of $pages huge pages of $page_kib kB ({gib} GiB wanted); MemAvailable: $available." >&2
  echo "Free memory (or set vm.nr_hugepages at boot) and run again, or lower ascend-pd:hugepages.gib." >&2
  exit 1
fi
mkdir -p {q(sysctl_file.rsplit('/', 1)[0])}
echo "vm.nr_hugepages = $pages" > {q(sysctl_file)}
echo "huge pages on {node}: $total x $page_kib kB"
"""
    delete = _header(plan, node, "huge pages (restore)") + f"""
if [ -f {q(state_file)} ]; then
  cat {q(state_file)} > {q(nr_hugepages)}
  echo "vm.nr_hugepages restored to $(cat {q(state_file)}) on {node}"
  rm -f {q(state_file)}
fi
rm -f {q(sysctl_file)}
"""
    return Script("hugepages", node, "host", create, delete)


# ---------------------------------------------------------------------------------------------
# Container preparation


def prepare(plan: Plan, node: str) -> tuple[Script, ...]:
    """One script per step so a changed step re-runs alone. Package installs have no undo: they
    last as long as the container (replacing the container starts from the image again)."""
    cfg = plan.cfg
    steps: list[Script] = []
    keep = "echo 'installed packages stay until the container is replaced'\n"
    y = cfg.yuanrong
    steps.append(Script(
        "install-yuanrong", node, "container",
        _header(plan, node, "install openYuanrong Datasystem", cann_env=True) + f"""
pip install --no-input {q(y.package)} > /tmp/ascend-pd-pip-yuanrong.log 2>&1 \\
  || fail_with_log /tmp/ascend-pd-pip-yuanrong.log "pip install {y.package} failed"
python3 -c 'import yr.datasystem' && command -v dscli >/dev/null
echo "openYuanrong Datasystem ready on {node}"
""".replace("set -euo pipefail\n", "set -euo pipefail\n" + LIB, 1),
        _header(plan, node, "openYuanrong package") + keep,
    ))
    if node == plan.etcd.node and plan.etcd.image is None:
        e = cfg.etcd
        steps.append(Script(
            "install-etcd", node, "container",
            _header(plan, node, f"install etcd {e.version} if missing") + f"""
if command -v {q(e.binary)} >/dev/null 2>&1; then
  echo "etcd present on {node}: $({q(e.binary)} --version | head -n 1)"
  exit 0
fi
case "$(uname -m)" in aarch64) arch=linux-arm64 ;; x86_64) arch=linux-amd64 ;; *) echo "unsupported $(uname -m)" >&2; exit 1 ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
curl -fsSL --max-time 600 -o "$tmp/etcd.tar.gz" "https://github.com/etcd-io/etcd/releases/download/{e.version}/etcd-{e.version}-$arch.tar.gz"
tar -xzf "$tmp/etcd.tar.gz" -C "$tmp"
cp "$tmp/etcd-{e.version}-$arch/etcd" "$tmp/etcd-{e.version}-$arch/etcdctl" /usr/local/bin/
echo "etcd {e.version} installed on {node}"
""",
            _header(plan, node, "etcd binary") + keep,
        ))
    for n, step in enumerate(cfg.container.prepare):
        if isinstance(step, PipStep):
            args = " ".join(q(a) for a in step.pip)
            steps.append(Script(
                step_name(step), node, "container",
                _header(plan, node, f"prepare step {n}: pip install", cann_env=True) + LIB + f"""
pip install --no-input {args} > /tmp/ascend-pd-prepare-{n}.log 2>&1 \\
  || fail_with_log /tmp/ascend-pd-prepare-{n}.log "pip install {' '.join(step.pip)} failed"
echo "pip install {' '.join(step.pip)}: done on {node}"
""",
                _header(plan, node, f"prepare step {n}") + keep,
            ))
        elif isinstance(step, PatchStep):
            steps.append(_patch_step(plan, node, n, step))
    return tuple(steps)


def _patch_step(plan: Plan, node: str, n: int, step: PatchStep) -> Script:
    """`git am` a patch series as a whole. Applying patch by patch is not re-runnable (a later patch
    may change what an earlier one added), so the series is always applied onto the commit the
    repository had before ascend-pd first touched it, and recorded with a fingerprint of the patch
    files: the same series on the same HEAD is left alone, anything else is reset and re-applied,
    and delete resets to that commit. ascend-pd owns these repositories' state: local edits in
    them are discarded."""
    name = step_name(step)
    repo, marks = q(step.repo), f"{plan.cfg.state_dir}/patches"
    base, applied = q(f"{marks}/{name}.base"), q(f"{marks}/{name}.applied")
    files = " ".join(q(p) for p in step.patches)
    git = f"git -C {repo}"
    missing = "\n".join(
        f'if [ ! -f {q(p)} ]; then echo "patch {p} is missing on {node}: copy it there first" >&2; exit 1; fi'
        for p in step.patches)
    create = _header(plan, node, f"prepare step {n}: patches for {step.repo}") + f"""
{missing}
mkdir -p {q(marks)}
want="$(sha256sum {files} | sha256sum | cut -c1-16) $({git} rev-parse HEAD)"
if [ -f {applied} ] && [ "$(cat {applied})" = "$want" ]; then
  echo "{step.repo}: {len(step.patches)} patch(es) already applied"
  exit 0
fi
if [ ! -f {base} ]; then {git} rev-parse HEAD > {base}; fi
{git} am --abort >/dev/null 2>&1 || true
{git} reset -q --hard "$(cat {base})"
if ! {git} -c user.name=ascend-pd -c user.email=ascend-pd@localhost am --3way {files}; then
  {git} am --abort >/dev/null 2>&1 || true
  {git} reset -q --hard "$(cat {base})"
  echo "git am failed in {step.repo}; the repository is back at $(cat {base})" >&2
  exit 1
fi
echo "$(sha256sum {files} | sha256sum | cut -c1-16) $({git} rev-parse HEAD)" > {applied}
echo "{step.repo}: applied {len(step.patches)} patch(es) onto $(cut -c1-12 {base})"
"""
    delete = _header(plan, node, f"prepare step {n}: revert patches in {step.repo}") + f"""
if [ -f {base} ]; then
  {git} am --abort >/dev/null 2>&1 || true
  {git} reset -q --hard "$(cat {base})"
  echo "{step.repo}: reset to $(cut -c1-12 {base})"
fi
rm -f {base} {applied}
"""
    return Script(name, node, "container", create, delete)


# ---------------------------------------------------------------------------------------------
# etcd (container on the etcd node)


def _etcd_health(e) -> str:
    return f"{CURL} -fsS -m 3 {e.client_url}/health 2>/dev/null | grep -q '\"health\":\"true\"'"


def etcd(plan: Plan) -> Script:
    if plan.etcd.image is not None:
        return _etcd_in_own_container(plan)
    e, cfg = plan.etcd, plan.cfg.etcd
    run, logs = _dirs(plan)
    pidfile, log = f"{run}/etcd.pid", f"{logs}/etcd.log"
    start = _background((), e.argv, log)
    health = _etcd_health(e)
    create = _header(plan, e.node, f"etcd {e.endpoint}") + LIB + f"""
mkdir -p {q(run)} {q(logs)}
{_managed_start("etcd", run, log, start, 30)}
deadline=$((SECONDS + {cfg.start_timeout_s}))
until {health}; do
  if ! alive "$(cat {q(pidfile)})"; then fail_with_log {q(log)} "etcd exited before it became healthy"; fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    stop_pidfiles 10 {q(pidfile)}
    fail_with_log {q(log)} "etcd not healthy at {e.client_url}/health within {cfg.start_timeout_s}s"
  fi
  sleep 1
done
echo "etcd healthy at {e.client_url}"
"""
    delete = _header(plan, e.node, "etcd (stop, remove data)") + LIB + f"""
stop_pidfiles 30 {q(pidfile)}
# Stale member data makes the next start fail or resurrect old worker registrations (seed FAQ).
rm -rf {q(e.data_dir)}
echo "etcd stopped, {e.data_dir} removed"
"""
    return Script("etcd", e.node, "container", create, delete)


def _etcd_in_own_container(plan: Plan) -> Script:
    """Image mode: docker (EtcdSingle) runs etcd in its own container; this gate waits for it from the
    NPU container, which shares the host network and has curl (the etcd image is distroless)."""
    e, cfg = plan.etcd, plan.cfg.etcd
    where = f"container {e.container_name} ({e.image})"
    create = _header(plan, e.node, f"etcd {e.endpoint} in {where}: health gate") + f"""
deadline=$((SECONDS + {cfg.start_timeout_s}))
until {_etcd_health(e)}; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "etcd in {where} not healthy at {e.client_url}/health within {cfg.start_timeout_s}s" >&2
    echo "its log: docker logs {e.container_name} (on {e.node})" >&2
    exit 1
  fi
  sleep 1
done
echo "etcd healthy at {e.client_url}"
"""
    delete = _header(plan, e.node, "etcd health gate") + f"""
# Destroying the etcd container removes etcd and its data dir {e.data_dir} with it.
echo "etcd in {where}: removed with its container"
"""
    return Script("etcd", e.node, "container", create, delete)


# ---------------------------------------------------------------------------------------------
# openYuanrong worker (container, every node)


WORKER_LIB = r"""
worker_pids() {  # worker_pids ADDRESS: datasystem_worker processes serving exactly ADDRESS
  local d cmd
  for d in /proc/[0-9]*; do
    # 2>/dev/null first: a process that exits mid-scan must not print "No such file" noise.
    cmd=$(tr '\0' ' ' 2>/dev/null < "$d/cmdline") || continue
    case "$cmd" in *datasystem_worker" "*) ;; *) continue ;; esac
    # dscli passes --worker_address=ADDR: matching the whole flag keeps 10.0.0.1:18481 from
    # matching 110.0.0.1:18481, and a shell whose command line holds this script from matching.
    case " $cmd" in *" --worker_address=$1 "*) echo "${d#/proc/}" ;; esac
  done
}
signal_worker() {  # signal_worker SIGNAL ADDRESS SECONDS: signal it, then wait up to SECONDS for it to exit
  local deadline=$((SECONDS + $3)) pid
  for pid in $(worker_pids "$2"); do kill "-$1" "$pid" 2>/dev/null || true; done
  while [ -n "$(worker_pids "$2")" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 1; done
}
stop_worker() {  # stop_worker ADDRESS STOP_TIMEOUT: dscli stop (bounded), TERM, KILL; 1 if it survives
  [ -n "$(worker_pids "$1")" ] || return 0
  # dscli stop's own wait is 180 s + shared memory / 40 s (hours at 500 GB): bound it.
  if ! timeout "$2" dscli stop --worker_address "$1"; then
    echo "dscli stop failed or did not finish within $2s: terminating the worker" >&2
  fi
  signal_worker TERM "$1" __GRACE__
  # KILL is asynchronous: the worker holds its port and files until it is gone.
  signal_worker KILL "$1" 10
  if [ -n "$(worker_pids "$1")" ]; then
    echo "worker $1 (pid $(worker_pids "$1" | tr '\n' ' ')) survived KILL" >&2
    return 1
  fi
}
""".replace("__GRACE__", str(WORKER_KILL_GRACE_S))


def worker(plan: Plan, node: str) -> Script:
    w = plan.worker(node)
    y = plan.cfg.yuanrong
    run, logs = _dirs(plan)
    # `dscli start -t N [numactl opts] -w` on one line, then one worker flag per line. Started without
    # proxy variables: the worker's gRPC etcd client honours http_proxy and would dial the proxy.
    cut = w.argv.index("-w") + 1
    head, flags = w.argv[:cut], w.argv[cut:]
    start = " \\\n  ".join(
        ["env " + " ".join(f"-u {u}" for u in UNSET_ENV) + " " + " ".join(q(a) for a in head)]
        + [f"{flags[i]} {q(flags[i + 1])}" if flags[i].startswith("--") and i + 1 < len(flags) else q(flags[i])
           for i in _flag_positions(flags)]
    )
    spec = _spec(start)
    specfile = f"{run}/worker.spec"
    log = f"{logs}/dscli-start.log"
    worker_log = f"{w.workdir}/datasystem/logs/datasystem_worker.INFO.log"  # dscli's ./datasystem, from workdir
    liveness = y.liveness_path
    create = _header(plan, node, f"openYuanrong worker {w.address}", cann_env=True) + LIB + WORKER_LIB + f"""
mkdir -p {q(run)} {q(logs)} {q(w.workdir)}
if [ -n "$(worker_pids {q(w.address)})" ]; then
  if [ "$(cat {q(specfile)} 2>/dev/null)" = {spec} ]; then
    echo "worker {w.address}: already running (pid $(worker_pids {q(w.address)} | tr '\\n' ' '))"
    exit 0
  fi
  echo "worker {w.address}: running with older flags: restarting"
  stop_worker {q(w.address)} {y.stop_timeout_s}
fi
# dscli resolves ./datasystem (logs, rocksdb, uds) against the current directory: always the same one.
cd {q(w.workdir)}
rm -f {q(liveness)}
# dscli start returns once the worker is ready and kills it itself after -t seconds. stdin from
# /dev/null: the worker inherits it and must not hold (or read) the pipe this script arrives on.
attempt=1
until timeout {y.start_timeout_s + 60} {start} > {q(log)} 2>&1 < /dev/null; do
  signal_worker KILL {q(w.address)} {WORKER_KILL_GRACE_S}
  # Killed by a signal while starting (dscli: "exited with code -9"): right after a restart the
  # worker's own etcd thread can SIGKILL it as it rejoins the pool (seen in 2 of ~135 restarts on
  # a loaded machine). A fresh start succeeds; anything else (a bad flag, a timeout) fails again.
  if [ "$attempt" -lt {y.start_attempts} ] && grep -qs 'Worker exited with code -[0-9]' {q(log)}; then
    echo "worker {w.address}: killed while starting (attempt $attempt of {y.start_attempts}): starting again"
    mv -f {q(log)} {q(log)}.$attempt
    attempt=$((attempt + 1))
    sleep {WORKER_RETRY_PAUSE_S}
    continue
  fi
  {{
    echo "openYuanrong worker {w.address} failed to start (dscli start -t {y.start_timeout_s}, attempt $attempt of {y.start_attempts})"
    echo "--- dscli start ({log}):"
    grep -vF '[INFO] Starting with numactl command:' {q(log)} | tail -n {LOG_TAIL} || true
    echo "--- last warnings and errors of {worker_log}:"
    grep -s ' | [WEF] | ' {q(worker_log)} | tail -n {LOG_TAIL} || true
  }} >&2
  exit 1
done
deadline=$((SECONDS + 30))
until grep -qs 'liveness check success' {q(liveness)}; do
  if [ "$SECONDS" -ge "$deadline" ]; then fail_with_log {q(log)} "worker {w.address} never wrote a successful {liveness}"; fi
  sleep 1
done
# The liveness file outlives its writer: only a worker still running counts as started.
if [ -z "$(worker_pids {q(w.address)})" ]; then
  fail_with_log {q(worker_log)} "worker {w.address} exited right after it became ready"
fi
echo {spec} > {q(specfile)}
echo "worker {w.address}: ready, registered with etcd {plan.etcd.endpoint}"
"""
    delete = _header(plan, node, f"openYuanrong worker {w.address} (stop, clean)", cann_env=True) + WORKER_LIB + f"""
cd {q(w.workdir)} 2>/dev/null || true
# Its files go only once it is gone (stop_worker fails the delete otherwise).
stop_worker {q(w.address)} {y.stop_timeout_s}
# Stale rocksdb metadata and client logs cause 'key not found' after an unclean stop (seed FAQ).
rm -rf {q(w.workdir)}/datasystem "$HOME/.datasystem" {q(liveness)} {q(specfile)}
echo "worker {w.address}: stopped and cleaned"
"""
    return Script("worker", node, "container", create, delete)


def _flag_positions(argv: tuple[str, ...]) -> list[int]:
    """Indices that start a rendered line: a lone word, or a --flag with its value."""
    out, i = [], 0
    while i < len(argv):
        out.append(i)
        i += 2 if argv[i].startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("-") else 1
    return out


# ---------------------------------------------------------------------------------------------
# vLLM ranks (container): one script per (instance, node)


def launch(plan: Plan, instance: Instance, node: str) -> Script:
    run, logs = _dirs(plan)
    ranks = instance.ranks_on(node)
    grace = plan.cfg.vllm.stop_timeout_s
    timeout = plan.cfg.vllm.ready_timeout_s
    blocks, names = [], []
    for r in ranks:
        names.append(r.name)
        start = _background(r.env, r.argv, f"{logs}/{r.name}.log")
        blocks.append(f"# {r.name}: DP rank {r.dp_rank}/{r.dp_size}, devices {r.visible_devices}, port {r.port}\n"
                      + _managed_start(r.name, run, f"{logs}/{r.name}.log", start, grace))
    checks = "\n  ".join(
        f"check_rank {r.name} http://{r.address}:{r.port}/health && healthy=$((healthy + 1))" for r in ranks
    )
    unhealthy_logs = "\n    ".join(
        f"{CURL} -fsS -o /dev/null -m 3 http://{r.address}:{r.port}/health 2>/dev/null || show_log {r.name}" for r in ranks
    )
    stop_all = f"stop_pidfiles {grace} " + " ".join(q(f"{run}/{n}.pid") for n in names)
    keep = "|".join(names)
    create = _header(plan, node, f"{instance.name} ranks {', '.join(names)}", cann_env=True) + LIB + f"""
mkdir -p {q(run)} {q(logs)}
# Ranks of {instance.name} on this node that the plan no longer has (dp or layout changed): stop them.
unplanned=()
for pidfile in {q(run)}/{instance.name}-r*.pid; do
  [ -e "$pidfile" ] || continue
  case "$(basename "$pidfile" .pid)" in {keep}) ;; *) echo "stopping $(basename "$pidfile" .pid): no longer planned"; unplanned+=("$pidfile") ;; esac
done
if [ "${{#unplanned[@]}}" -gt 0 ]; then stop_pidfiles {grace} "${{unplanned[@]}}"; fi
stop_local_ranks() {{
{stop_all}
}}
show_log() {{
  echo "--- last lines of {logs}/$1.log:" >&2
  tail -n {LOG_TAIL} "{logs}/$1.log" >&2 || true
}}
check_rank() {{  # check_rank NAME URL: 0 healthy, 1 not yet; a dead rank fails the whole launch
  local pid
  pid=$(cat "{run}/$1.pid")
  if ! alive "$pid"; then
    echo "$1 (pid $pid) exited before answering /health" >&2
    show_log "$1"
    stop_local_ranks
    exit 1
  fi
  {CURL} -fsS -o /dev/null -m 3 "$2" 2>/dev/null
}}

{chr(10).join(blocks)}

# Wait until every local rank answers /health (ranks of a multi-node instance need their peers up).
deadline=$((SECONDS + {timeout}))
report=$((SECONDS + {PROGRESS_EVERY_S}))
while :; do
  healthy=0
  {checks}
  if [ "$healthy" -eq {len(ranks)} ]; then break; fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "{instance.name} on {node}: only $healthy of {len(ranks)} ranks healthy after {timeout}s" >&2
    {unhealthy_logs}
    stop_local_ranks
    exit 1
  fi
  if [ "$SECONDS" -ge "$report" ]; then
    echo "{instance.name} on {node}: $healthy/{len(ranks)} ranks healthy after $SECONDS s"
    report=$((SECONDS + {PROGRESS_EVERY_S}))
  fi
  sleep {POLL_S}
done
echo "{instance.name} on {node}: {len(ranks)}/{len(ranks)} ranks healthy"
"""
    delete = _header(plan, node, f"{instance.name} ranks (stop)") + LIB + f"""
# Every rank of {instance.name} this node ever ran (the glob also finds ranks an older plan had).
stop_pidfiles {grace} {q(run)}/{instance.name}-r*.pid
echo "{instance.name} on {node}: ranks stopped"
"""
    return Script(f"launch-{instance.name}", node, "container", create, delete)


# ---------------------------------------------------------------------------------------------
# PD proxy (container on the proxy node)


def proxy(plan: Plan) -> Script:
    p, cfg = plan.proxy, plan.cfg
    run, logs = _dirs(plan)
    pidfile, log = f"{run}/proxy.pid", f"{logs}/proxy.log"
    start = _background((), p.argv, log)
    n_pre, n_dec = len(p.prefillers), len(p.decoders)
    py = q(cfg.proxy.python)  # the proxy's interpreter: the one this container is known to have
    create = _header(plan, p.node, f"PD proxy {p.url}", cann_env=True) + LIB + f"""
mkdir -p {q(run)} {q(logs)}
{_managed_start("proxy", run, log, start, 30)}
# /healthcheck must report every planned instance: {n_pre} prefill, {n_dec} decode.
deadline=$((SECONDS + {cfg.proxy.ready_timeout_s}))
until {CURL} -fsS -m 5 {p.url}/healthcheck 2>/dev/null | {py} -c '
import json, sys
try:
    h = json.load(sys.stdin)
except ValueError:
    sys.exit(1)  # not listening yet: no body (quietly, this runs every 2 s)
sys.exit(0 if (h.get("prefill_instances"), h.get("decode_instances")) == ({n_pre}, {n_dec}) else 1)'; do
  if ! alive "$(cat {q(pidfile)})"; then fail_with_log {q(log)} "the proxy exited before /healthcheck answered"; fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "last /healthcheck: $({CURL} -sS -m 5 {p.url}/healthcheck 2>&1 || true)" >&2
    stop_pidfiles 10 {q(pidfile)}
    fail_with_log {q(log)} "proxy /healthcheck did not report {n_pre} prefill + {n_dec} decode instances within {cfg.proxy.ready_timeout_s}s"
  fi
  sleep 2
done
# The seeds' functional check: one chat completion through the proxy must return text.
{py} - <<'SMOKE' || {{ stop_pidfiles 10 {q(pidfile)}; fail_with_log {q(log)} "smoke completion through the proxy failed"; }}
import json, sys, time, urllib.request
body = {{"model": {cfg.model.served_name!r}, "messages": [{{"role": "user", "content": "hello"}}],
        "max_tokens": 16, "temperature": 0, "stream": False,
        "chat_template_kwargs": {{"enable_thinking": False}}}}
req = urllib.request.Request({(p.url + '/v1/chat/completions')!r}, data=json.dumps(body).encode(),
                             headers={{"Content-Type": "application/json"}})
t0 = time.monotonic()
direct = urllib.request.build_opener(urllib.request.ProxyHandler({{}}))  # never via http_proxy
try:
    with direct.open(req, timeout={cfg.proxy.smoke_timeout_s}) as resp:
        answer = json.load(resp)
except Exception as exc:
    sys.exit(f"smoke completion failed: {{exc}}")
msg = answer["choices"][0]["message"]
# Reasoning models may answer only in `reasoning` (vLLM >= 0.17) or `reasoning_content` (older).
text = msg.get("content") or msg.get("reasoning") or msg.get("reasoning_content") or ""
if not text.strip():
    sys.exit(f"smoke completion returned no text: {{json.dumps(answer)[:500]}}")
print(f"smoke completion ok in {{time.monotonic() - t0:.1f}}s: {{text.strip()[:60]!r}}")
SMOKE
echo "proxy ready at {p.url} ({n_pre} prefill, {n_dec} decode)"
"""
    delete = _header(plan, p.node, "PD proxy (stop)") + LIB + f"""
stop_pidfiles 30 {q(pidfile)}
echo "proxy stopped"
"""
    return Script("proxy", p.node, "container", create, delete)


# ---------------------------------------------------------------------------------------------
# Transport wrappers and the per-node inventory


def in_container(container: str, script: str, *, missing_ok: bool = False) -> str:
    """The command Pulumi runs on the node: the script, whole and literal, on docker exec's stdin."""
    run = f"docker exec -i {q(container)} bash -s <<'{HEREDOC}'\n{script}{HEREDOC}\n"
    if not missing_ok:
        return run
    # Deletes must not fail when the container is already gone (its processes went with it).
    return (f"if docker inspect --type container {q(container)} >/dev/null 2>&1; then\n{run}"
            f"else\n  echo 'container {container} is gone: nothing to do'\nfi\n")


def on_host(script: str) -> str:
    return f"bash -s <<'{HEREDOC}'\n{script}{HEREDOC}\n"


def node_scripts(plan: Plan, node: str) -> tuple[Script, ...]:
    """Every script of a node in start order (render, golden files, integration tests)."""
    out: list[Script] = []
    if plan.cfg.hugepages:
        out.append(hugepages(plan, node))
    out += prepare(plan, node)
    if node == plan.etcd.node:
        out.append(etcd(plan))
    out.append(worker(plan, node))
    for inst in plan.instances:
        if node in inst.nodes:
            out.append(launch(plan, inst, node))
    if node == plan.proxy.node:
        out.append(proxy(plan))
    from .probes import probes  # probes builds on this module's Script

    out.append(probes(plan, node))
    return tuple(out)
