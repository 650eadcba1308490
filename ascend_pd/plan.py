"""The deployment plan: every value two places must agree on, derived once from a StackConfig.

`build_plan(cfg)` validates the whole configuration (every problem at once, each naming its setting
and the fix), then derives nodes and roles, DP instances, every rank (node, devices, port, global DP
rank, DP master address, RPC port), each rank's full `vllm serve` argv and environment, the proxy's
argv, and the etcd and worker command lines. Shell text is rendered from this in `scripts.py`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional

from .config import KV_POOL_BACKEND, Role, StackConfig, node_image
from .releases import check as check_releases
from .secrets import PROXY_KEY_FILE, RUN_SUBDIR as SECRETS_SUBDIR, is_placeholder
from .errors import ConfigError, Problem
from .valuetypes import resolve_count
from .plan_checks import (  # noqa: F401 (what the plan derives; imported from here by scripts, docs, status)
    DERIVED_ENV, DERIVED_FLAGS, DERIVED_WORKER_FLAGS, MOONCAKE_DIRECT_BASE, MOONCAKE_DIRECT_PER_DEVICE, ROLES,
    UDS_PATH_MAX, UDS_SUFFIX, WORKER_SUBDIR, _validate, mooncake_direct_range,
)

# Unset in the environment of every service ascend-pd starts (ranks, proxy, worker, etcd), as the
# seeds do for ranks. The services talk to each other directly (rank to rank, proxy to rank, worker
# to etcd over gRPC); a proxy variable from the container's env would capture that traffic, in
# every spelling some client honours: curl reads lower case and HTTPS_PROXY, Python's
# urllib/requests/httpx both cases and ALL_PROXY, gRPC grpc_proxy/https_proxy/http_proxy.
# glog-to-stderr floods the openYuanrong client's output (the seeds unset it too).
UNSET_ENV = (
    "http_proxy", "https_proxy", "ftp_proxy", "all_proxy", "grpc_proxy",
    "HTTP_PROXY", "HTTPS_PROXY", "FTP_PROXY", "ALL_PROXY",
    "GOOGLE_LOGTOSTDERR", "GOOGLE_ALSOLOGTOSTDERR",
)
# Install steps record themselves done here, in the container (ascend_pd.scripts.prepare).
PREPARED_SUBDIR = "prepared"


@dataclass(frozen=True)
class NodePlan:
    name: str
    address: str
    nic: str
    npus: int
    roles: tuple[str, ...]  # subset of prefill, decode, etcd, proxy
    image: str  # of its NPU container: its role's `image`, else container.image
    former_names: tuple[str, ...] = ()  # earlier names: resources keep their identity (aliases)

    def names_of(self, suffix: str) -> tuple[str, ...]:
        """Earlier names of this node's resource `<node>-<suffix>` (Pulumi aliases)."""
        return tuple(f"{old}-{suffix}" for old in self.former_names)


def rank_url(address: str, port: int) -> str:
    return f"http://{address}:{port}"


@dataclass(frozen=True)
class Rank:
    role: str
    instance: int
    node: str
    address: str
    local_index: int
    dp_rank: int
    dp_size: int
    tp: int
    devices: tuple[int, ...]
    port: int
    dp_address: str
    rpc_port: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    kv_transfer_config: str  # the JSON text passed to --kv-transfer-config
    # Variables whose values are secret (ascend_pd/secrets.py): read from the role's secrets file, never in env.
    secret_env: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.role}-{self.instance}-r{self.dp_rank}"

    @property
    def url(self) -> str:
        """Its API server: what the proxy lists (ProxyPlan.backends_json) and status reads."""
        return rank_url(self.address, self.port)

    @property
    def instance_name(self) -> str:
        return f"{self.role}-{self.instance}"

    @property
    def visible_devices(self) -> str:
        return ",".join(str(d) for d in self.devices)


@dataclass(frozen=True)
class Instance:
    role: str
    index: int
    nodes: tuple[str, ...]
    dp: int
    tp: int
    dp_address: str
    ranks: tuple[Rank, ...]

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    def ranks_on(self, node: str) -> tuple[Rank, ...]:
        return tuple(r for r in self.ranks if r.node == node)


@dataclass(frozen=True)
class EtcdPlan:
    node: str
    address: str
    client_port: int
    peer_port: int
    data_dir: str
    argv: tuple[str, ...]
    image: Optional[str] = None  # its own container from this image, else a binary in the NPU container
    container_name: Optional[str] = None  # of that container

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.client_port}"

    @property
    def identity(self) -> str:
        """What a change of makes a new, empty etcd (where it runs, its data): the workers' scripts
        carry it, so such a change updates every worker, which then registers again."""
        where = f"container {self.container_name} from {self.image}" if self.image else "binary"
        return f"{self.endpoint} peer {self.peer_port} data {self.data_dir} ({where})"

    @property
    def client_url(self) -> str:
        return f"http://{self.endpoint}"


@dataclass(frozen=True)
class WorkerPlan:
    node: str
    address: str  # host:port, the key under /datasystem/cluster/ in etcd
    workdir: str
    argv: tuple[str, ...]  # full `dscli start ...`

    @property
    def log(self) -> str:
        """The worker's own log: dscli's ./datasystem, relative to the fixed working directory."""
        return f"{self.workdir}/datasystem/logs/datasystem_worker.INFO.log"


@dataclass(frozen=True)
class ProxyPlan:
    node: str
    address: str
    port: int
    argv: tuple[str, ...]
    prefillers: tuple[tuple[str, int], ...]
    decoders: tuple[tuple[str, int], ...]

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    @property
    def backends_json(self) -> str:
        """The proxy's backends as rank URLs, `{"prefill": [...], "decode": [...]}`: whose /metrics the
        P/D smoke check reads."""
        return json.dumps({"prefill": [rank_url(h, p) for h, p in self.prefillers],
                           "decode": [rank_url(h, p) for h, p in self.decoders]}, separators=(",", ":"))


@dataclass(frozen=True)
class Plan:
    stack: str
    cfg: StackConfig = field(repr=False)
    nodes: tuple[NodePlan, ...]
    instances: tuple[Instance, ...]
    etcd: EtcdPlan
    workers: tuple[WorkerPlan, ...]
    proxy: ProxyPlan
    # What the releases the images run do not read or warn about (releases.check): said by render, diff
    # and the program under `pulumi preview`; vllmAscend.strict makes them errors instead.
    warnings: tuple[Problem, ...] = ()

    @cached_property
    def ranks(self) -> tuple[Rank, ...]:
        return tuple(r for i in self.instances for r in i.ranks)

    def node(self, name: str) -> NodePlan:
        return self._by_name[name]

    def worker(self, node: str) -> WorkerPlan:
        return self._workers_by_node[node]

    # Lookups by name: every component, script and check asks by name, so a scan per question made
    # rendering a 256-node stack quadratic. Frozen dataclass: cached_property writes the instance's
    # __dict__ directly, and equality still compares the fields only.
    @cached_property
    def _by_name(self) -> dict[str, NodePlan]:
        return {n.name: n for n in self.nodes}

    @cached_property
    def _workers_by_node(self) -> dict[str, WorkerPlan]:
        return {w.node: w for w in self.workers}

    @property
    def spares(self) -> tuple[str, ...]:
        """Nodes of no role: prepared like every node (huge pages, container, image, openYuanrong worker in
        the KV pool) but running no rank. `replan --without NODE` puts one in a lost node's place, which
        then costs one model load."""
        serving = {n for i in self.instances for n in i.nodes}
        return tuple(n.name for n in self.nodes if n.name not in serving)

    def instances_of(self, role: str) -> tuple[Instance, ...]:
        return tuple(i for i in self.instances if i.role == role)

    def max_unavailable(self, role: str) -> int:
        """`rollout.maxUnavailable` resolved for `role`: its restart slots, which the launches, `diff`
        and the docs all read from here."""
        return resolve_count(self.cfg.rollout.max_unavailable, len(self.instances_of(role)))

    def ranks_of(self, role: str) -> tuple[Rank, ...]:
        return tuple(r for i in self.instances_of(role) for r in i.ranks)

    def instance_on(self, node: str) -> Optional[Instance]:
        """The instance whose ranks run on `node` (a node serves at most one), or None."""
        return next((i for i in self.instances if node in i.nodes), None)

    def service_ports(self, node: str) -> tuple[tuple[int, str], ...]:
        """(port, what) of every fixed TCP port this stack's services listen on at `node` that a machine
        outside the cluster reads: `status` and the exporter (ranks, workers, etcd's client port, the
        proxy), Prometheus (also its own port and the site's node_exporter). The firewall opens exactly
        these to `firewall.operators`."""
        out = [(r.port, r.name) for r in self.ranks if r.node == node]
        out.append((int(self.worker(node).address.rsplit(":", 1)[1]), "openYuanrong worker"))
        if node == self.etcd.node:
            out.append((self.etcd.client_port, "etcd client"))
        if node == self.proxy.node:
            out.append((self.proxy.port, "PD proxy"))
        m = self.cfg.monitoring
        if node == m.node:
            out.append((m.port, "Prometheus"))
        if m.node_exporter_port is not None:
            out.append((m.node_exporter_port, "node_exporter"))
        return tuple(out)

    @property
    def up_parallelism(self) -> int:
        """What to pass as `pulumi up --parallel`: every node's image pull, huge pages and launch can
        run at once, and every node of a DP group must launch at once (its ranks form the group
        only together). The CLI's default, 4 x the operator's CPUs, is 8 on a 2-CPU runner.
        tests/test_engine_model.py checks it against the engine model's makespan."""
        return 2 * len(self.nodes)

    @property
    def state_dir(self) -> str:
        return self.cfg.state_dir.rstrip("/")

    @property
    def run_dir(self) -> str:
        return run_dir_of(self.cfg)

    @property
    def log_dir(self) -> str:
        return f"{self.state_dir}/logs"

    @property
    def probe_dir(self) -> str:
        return f"{self.state_dir}/probes"

    @property
    def prepared_dir(self) -> str:
        return f"{self.state_dir}/{PREPARED_SUBDIR}"




# ---------------------------------------------------------------------------------------------
# Derivation


def _flag_args(flags: dict) -> list[str]:
    """`--key value` per flag, in key order: the order of a stack file's `flags` map means nothing,
    so reordering its keys changes no script and no fingerprint (restarts nothing). A JSON value's
    keys are sorted for the same reason."""
    out: list[str] = []
    for key, value in sorted(flags.items()):
        if value is None or value is False:
            continue  # null/false drop a flag (e.g. a role removing a common one)
        if value is True:
            out.append(f"--{key}")
        elif isinstance(value, (dict, list)):
            out += [f"--{key}", json.dumps(value, separators=(", ", ": "), sort_keys=True)]
        else:
            out += [f"--{key}", str(value)]
    return out


def kv_transfer_config(cfg: StackConfig, role: str, instance: int, dp_rank: int) -> dict:
    """MultiConnector of [Mooncake, AscendStoreConnector(yuanrong)], per DESIGN.md."""
    r: Role = getattr(cfg, role)
    kv_role = "kv_producer" if role == "prefill" else "kv_consumer"
    mooncake: dict = {"kv_connector": r.connector, "kv_role": kv_role, "kv_port": str(r.kv_port)}
    if r.connector_module_path:
        mooncake["kv_connector_module_path"] = r.connector_module_path
    mooncake["kv_connector_extra_config"] = {
        "use_ascend_direct": True,
        # Per-instance sizes: what one prefill instance hands to one decode instance.
        "prefill": {"dp_size": cfg.prefill.dp, "tp_size": cfg.prefill.tp},
        "decode": {"dp_size": cfg.decode.dp, "tp_size": cfg.decode.tp},
    }
    store = {
        "kv_connector": "AscendStoreConnector",
        "kv_role": kv_role,
        "kv_connector_extra_config": {
            # Names an IPC socket together with the DP rank: prefill and decode must differ on a host.
            "lookup_rpc_port": "0" if role == "prefill" else str(dp_rank),
            "backend": KV_POOL_BACKEND,
        },
    }
    parent: dict = {"kv_connector": "MultiConnector", "kv_role": kv_role}
    if role == "prefill":
        # Unique per prefill instance (the A2 seed gives all four "0"); never inside a child.
        parent["engine_id"] = str(instance)
    parent["kv_connector_extra_config"] = {"connectors": [mooncake, store]}
    return parent


def secret_env(cfg: StackConfig, role: str) -> tuple[tuple[str, str], ...]:
    """(name, the setting that holds it) of every secret variable of a role's ranks: its own env over
    vllm.env, as the ranks' environment is merged."""
    merged = {**{k: ("vllm", v) for k, v in cfg.vllm.env.items()},
              **{k: (role, v) for k, v in getattr(cfg, role).env.items()}}
    return tuple((k, f"{src}.env.{k}") for k, (src, v) in sorted(merged.items()) if is_placeholder(v))


def _rank_env(cfg: StackConfig, role: str, node, devices: tuple[int, ...]) -> tuple[tuple[str, str], ...]:
    r: Role = getattr(cfg, role)
    env: dict[str, str] = {}
    # Key order: the stack file's order of `env` keys means nothing (values expand from the
    # container's environment, never from each other), so it must not change a fingerprint.
    for k, v in sorted({**cfg.vllm.env, **r.env}.items()):
        if is_placeholder(v):
            continue  # from the role's secrets file (secret_env), never on a command line
        env[k] = str(v).lower() if isinstance(v, bool) else str(v)
    env.update({
        "HCCL_IF_IP": node.address,
        "GLOO_SOCKET_IFNAME": node.nic,
        "TP_SOCKET_IFNAME": node.nic,
        "HCCL_SOCKET_IFNAME": node.nic,
        "ASCEND_RT_VISIBLE_DEVICES": ",".join(str(d) for d in devices),
        "DS_WORKER_ADDR": f"{node.address}:{cfg.yuanrong.port}",
        "PYTHONHASHSEED": "0",
        # vLLM aborts an engine core not ready within this (default 600 s, less than loading a large
        # model takes; seed 000's FAQ sets 3600): the launch's own deadline, so the two agree.
        "VLLM_ENGINE_READY_TIMEOUT_S": str(cfg.vllm.ready_timeout_s),
    })
    if cfg.yuanrong.rh2d_device_ids:
        env["DS_ENABLE_REMOTE_H2D"] = "1"
    return tuple(env.items())


def _instances(cfg: StackConfig, role: str) -> tuple[Instance, ...]:
    r: Role = getattr(cfg, role)
    nodes = {n.name: n for n in cfg.nodes}
    local = r.dp // r.nodes_per_instance
    out = []
    for idx, k in enumerate(range(0, len(r.nodes), r.nodes_per_instance)):
        group = tuple(r.nodes[k : k + r.nodes_per_instance])
        master = nodes[group[0]].address
        ranks = []
        for pos, node_name in enumerate(group):
            node = nodes[node_name]
            for i in range(local):
                dp_rank = pos * local + i
                devices = tuple(range(i * r.tp, (i + 1) * r.tp))
                port = r.port_base + i
                kvt = json.dumps(kv_transfer_config(cfg, role, idx, dp_rank))
                flags = {**cfg.vllm.flags, **r.flags}
                argv = (
                    "vllm", "serve", cfg.model.path,
                    "--host", node.address,
                    "--port", str(port),
                    "--data-parallel-size", str(r.dp),
                    "--data-parallel-rank", str(dp_rank),
                    "--data-parallel-address", master,
                    "--data-parallel-rpc-port", str(r.rpc_port),
                    "--tensor-parallel-size", str(r.tp),
                    "--served-model-name", cfg.model.served_name,
                    *_flag_args(flags),
                    "--kv-transfer-config", kvt,
                )
                ranks.append(Rank(
                    role=role, instance=idx, node=node_name, address=node.address, local_index=i,
                    dp_rank=dp_rank, dp_size=r.dp, tp=r.tp, devices=devices, port=port,
                    dp_address=master, rpc_port=r.rpc_port, argv=argv,
                    env=_rank_env(cfg, role, node, devices), kv_transfer_config=kvt,
                    secret_env=tuple(k for k, _ in secret_env(cfg, role)),
                ))
        out.append(Instance(role=role, index=idx, nodes=group, dp=r.dp, tp=r.tp,
                            dp_address=master, ranks=tuple(ranks)))
    return tuple(out)


def _worker(cfg: StackConfig, node, etcd: EtcdPlan) -> WorkerPlan:
    y = cfg.yuanrong
    address = f"{node.address}:{y.port}"
    argv: list[str] = ["dscli", "start", "-t", str(y.start_timeout_s)]
    if y.interleave:
        argv += ["--interleave", y.interleave]  # numactl option: before -w, or it goes to the worker
    argv += [
        "-w",
        "--worker_address", address,
        "--etcd_address", etcd.endpoint,
        "--shared_memory_size_mb", str(y.shared_memory_mb),
        "--node_timeout_s", str(y.node_timeout_s),
        "--node_dead_timeout_s", str(y.node_dead_timeout_s),
        "--liveness_check_path", y.liveness_path,
    ]
    if y.arena_per_tenant is not None:
        argv += ["--arena_per_tenant", str(y.arena_per_tenant)]
    if y.rh2d_device_ids:
        argv += ["--remote_h2d_device_ids", ",".join(str(d) for d in y.rh2d_device_ids)]
    if y.huge_tlb:
        argv += ["--enable_huge_tlb", "true"]
    for k, v in sorted(y.flags.items()):  # key order: as `_flag_args`
        argv += [f"--{k}", str(v).lower() if isinstance(v, bool) else str(v)]
    return WorkerPlan(node=node.name, address=address, workdir=f"{cfg.state_dir}/{WORKER_SUBDIR}", argv=tuple(argv))


def run_dir_of(cfg: StackConfig) -> str:
    """Where pid files and the proxy's launcher live on every node (Plan.run_dir)."""
    return f"{cfg.state_dir.rstrip('/')}/run"


def secrets_dir_of(cfg: StackConfig) -> str:
    """Where the program delivers secrets in every container (mode 0600 files, read by the processes)."""
    return f"{run_dir_of(cfg)}/{SECRETS_SUBDIR}"


def role_secrets_file(cfg: StackConfig, role: str) -> str:
    """The role's secret variables, `NAME='value'` lines, sourced by its launches."""
    return f"{secrets_dir_of(cfg)}/{role}.env"


def proxy_key_file(cfg: StackConfig) -> Optional[str]:
    """The proxy's key (ascend-pd:proxyApiKey), read by pd_proxy_launch.py and the smoke; None without proxy.auth."""
    return f"{secrets_dir_of(cfg)}/{PROXY_KEY_FILE}" if cfg.proxy.auth else None


# Written into the run dir by the proxy's script (ascend_pd/shell/pd_proxy_launch.py): runs the release's
# proxy script unchanged, keeping removed instances out (ascend-pd:proxy.keepRemovedOut).
PROXY_LAUNCHER = "pd_proxy_launch.py"


# etcd keys of a role's rolling restarts (ascend_pd/shell/rollout_lib.sh): its restart slots
# <prefix>0 ... <prefix><maxUnavailable - 1>, each holding the restarting instance's name under a
# lease, and <prefix>failed, the instance whose restart failed (the role's waiting restarts stop).
ROLLOUT_KEY_PREFIX = "/ascend-pd/rollout"
ROLLOUT_FAILED = "failed"


# A slot taken by the delete in a replaced container is held through the container's replacement
# too: the container's delete and create and its preparation steps (pip installs, patches), for
# which there is no deadline of ours; this is the allowance (the worker's start has its own bound).
REPLACEMENT_ALLOWANCE_S = 1800


def restart_bound_s(cfg: StackConfig) -> int:
    """The longest one instance's restart may hold its rollout slot: stop, drain, container replacement,
    worker restart and model load (monitoring's AscendPdRolloutStuck fires beyond it)."""
    ro, y = cfg.rollout, cfg.yuanrong
    return (cfg.vllm.stop_timeout_s + ro.drain_timeout_s + cfg.vllm.ready_timeout_s + REPLACEMENT_ALLOWANCE_S
            + y.stop_timeout_s + y.start_timeout_s * y.start_attempts)


def rollout_prefix(stack: str, role: str) -> str:
    return f"{ROLLOUT_KEY_PREFIX}/{stack}/{role}/"


def build_plan(cfg: StackConfig, stack: str) -> Plan:
    """The plan, or a ConfigError with every problem of the settings and of the releases the images run
    (ascend_pd/releases.py); the releases' warnings ride along as `Plan.warnings`."""
    release_errors, warnings = check_releases(cfg)
    problems = _validate(cfg, stack) + release_errors
    if problems:
        raise ConfigError(problems)
    nodes = {n.name: n for n in cfg.nodes}
    e = cfg.etcd
    ea = nodes[e.node].address
    etcd = EtcdPlan(
        node=e.node, address=ea, client_port=e.client_port, peer_port=e.peer_port, data_dir=e.data_dir,
        image=e.image, container_name=e.container_name if e.image else None,
        argv=(
            e.binary,
            "--name", "etcd-single",
            "--data-dir", e.data_dir,
            "--listen-client-urls", f"http://{ea}:{e.client_port}",
            "--advertise-client-urls", f"http://{ea}:{e.client_port}",
            # One member: nothing but etcd itself uses the peer port, so it listens on loopback only.
            "--listen-peer-urls", f"http://127.0.0.1:{e.peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{e.peer_port}",
            "--initial-cluster", f"etcd-single=http://127.0.0.1:{e.peer_port}",
        ),
    )
    instances = _instances(cfg, "prefill") + _instances(cfg, "decode")
    pre = tuple((r.address, r.port) for i in instances if i.role == "prefill" for r in i.ranks)
    dec = tuple((r.address, r.port) for i in instances if i.role == "decode" for r in i.ranks)
    pa = nodes[cfg.proxy.node].address
    launcher: tuple[str, ...] = ()
    if cfg.proxy.keep_removed_out or cfg.proxy.auth:
        launcher = (f"{run_dir_of(cfg)}/{PROXY_LAUNCHER}",)
        if cfg.proxy.auth:  # the admin routes answer the cluster's nodes (the launches' drain calls) only
            admins = ",".join([n.address for n in cfg.nodes] + ["127.0.0.1"])
            launcher += ("--api-key-file", proxy_key_file(cfg), "--admin-from", admins)
        if not cfg.proxy.keep_removed_out:
            launcher += ("--as-shipped",)
    proxy_argv = (
        cfg.proxy.python, *launcher, cfg.proxy.script,
        "--host", pa,
        "--port", str(cfg.proxy.port),
        "--prefiller-hosts", *[h for h, _ in pre],
        "--prefiller-ports", *[str(p) for _, p in pre],
        "--decoder-hosts", *[h for h, _ in dec],
        "--decoder-ports", *[str(p) for _, p in dec],
        *_flag_args(cfg.proxy.flags.model_dump(by_alias=True, exclude_none=True)),
    )
    proxy = ProxyPlan(node=cfg.proxy.node, address=pa, port=cfg.proxy.port, argv=proxy_argv,
                      prefillers=pre, decoders=dec)

    roles: dict[str, list[str]] = {n.name: [] for n in cfg.nodes}
    for role in ROLES:
        for name in getattr(cfg, role).nodes:
            roles[name].append(role)
    roles[e.node].append("etcd")
    roles[cfg.proxy.node].append("proxy")
    node_plans = tuple(
        NodePlan(name=n.name, address=n.address, nic=n.nic, npus=cfg.npus, roles=tuple(roles[n.name]),
                 image=node_image(cfg, roles[n.name]), former_names=tuple(n.former_names))
        for n in cfg.nodes
    )
    workers = tuple(_worker(cfg, n, etcd) for n in cfg.nodes)
    return Plan(stack=stack, cfg=cfg, nodes=node_plans, instances=instances, etcd=etcd,
                workers=workers, proxy=proxy, warnings=tuple(warnings))


__all__ = [
    "Plan", "NodePlan", "Rank", "Instance", "EtcdPlan", "WorkerPlan", "ProxyPlan", "build_plan",
    "kv_transfer_config", "DERIVED_FLAGS", "DERIVED_ENV", "UNSET_ENV", "ROLES",
]
