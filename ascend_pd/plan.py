"""The deployment plan: every value two places must agree on, derived once from a StackConfig.

`build_plan(cfg)` validates the whole configuration (every problem at once, each naming its setting
and the fix), then derives nodes and roles, DP instances, every rank (node, devices, port, global DP
rank, DP master address, RPC port), each rank's full `vllm serve` argv and environment, the proxy's
argv, and the etcd and worker command lines. Shell text is rendered from this in `scripts.py`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional, Sequence

from .config import DEFAULT_MOUNTS, MONITORING_DIR, Role, StackConfig, docker_size_mib, step_name
from .errors import ConfigError, Problem, did_you_mean, setting
from .valuetypes import owned_path_problem

ROLES = ("prefill", "decode")

# Mooncake's AscendDirect transport listens on a random port in [20000 + 1000*dev, 20000 + 1000*(dev+1)],
# both ends inclusive (findAdxlListenPort: min + rand % (max - min + 1)), for every NPU of the node:
# nothing fixed may live in [20000, 20000 + 1000*NPUs].
MOONCAKE_DIRECT_BASE = 20000
MOONCAKE_DIRECT_PER_DEVICE = 1000


def mooncake_direct_range(npus: int) -> range:
    """Every port the AscendDirect transport of an `npus`-NPU node may draw (inclusive top)."""
    return range(MOONCAKE_DIRECT_BASE, MOONCAKE_DIRECT_BASE + MOONCAKE_DIRECT_PER_DEVICE * npus + 1)


# Flags the plan derives; writing them in a tuning map would create a second source of truth.
DERIVED_FLAGS = {
    "host": "it is each rank's node address (ascend-pd:nodes[].address)",
    "port": "set ascend-pd:<role>.portBase (rank i listens on portBase + i)",
    "data-parallel-size": "set ascend-pd:<role>.dp",
    "data-parallel-rank": "ranks are derived from the node order in ascend-pd:<role>.nodes",
    "data-parallel-address": "it is the instance's first node, from ascend-pd:<role>.nodes",
    "data-parallel-rpc-port": "set ascend-pd:<role>.rpcPort",
    "data-parallel-size-local": "it is dp / nodesPerInstance",
    "tensor-parallel-size": "set ascend-pd:<role>.tp",
    "kv-transfer-config": "set ascend-pd:<role>.kvPort / connector; the JSON is derived",
    "served-model-name": "set ascend-pd:model.servedName",
    "model": "set ascend-pd:model.path",
}
DERIVED_ENV = {
    "PYTHONHASHSEED": "it is always 0 on every rank (pool keys must hash identically)",
    "DS_WORKER_ADDR": "it is the node address with ascend-pd:yuanrong.port",
    "DS_ENABLE_REMOTE_H2D": "set ascend-pd:yuanrong.rh2dDeviceIds to enable RH2D",
    "HCCL_IF_IP": "it is the node address",
    "GLOO_SOCKET_IFNAME": "set ascend-pd:nodes[].nic",
    "TP_SOCKET_IFNAME": "set ascend-pd:nodes[].nic",
    "HCCL_SOCKET_IFNAME": "set ascend-pd:nodes[].nic",
    "ASCEND_RT_VISIBLE_DEVICES": "devices follow from ascend-pd:<role>.tp and the rank layout",
    "VLLM_ENGINE_READY_TIMEOUT_S": "it is ascend-pd:vllm.readyTimeoutS (the launch's own deadline)",
}
# Worker flags the plan derives; `yuanrong.flags` must not set them a second time.
DERIVED_WORKER_FLAGS = {
    "worker_address": "it is the node address with ascend-pd:yuanrong.port",
    "etcd_address": "it is the etcd node's address with ascend-pd:etcd.clientPort",
    "shared_memory_size_mb": "set ascend-pd:yuanrong.sharedMemoryMb",
    "node_timeout_s": "set ascend-pd:yuanrong.nodeTimeoutS",
    "node_dead_timeout_s": "set ascend-pd:yuanrong.nodeDeadTimeoutS",
    "liveness_check_path": "set ascend-pd:yuanrong.livenessPath",
    "arena_per_tenant": "set ascend-pd:yuanrong.arenaPerTenant",
    "remote_h2d_device_ids": "set ascend-pd:yuanrong.rh2dDeviceIds",
    "enable_huge_tlb": "set ascend-pd:yuanrong.hugeTlb",
}
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
# The worker's unix sockets live at <workdir>/datasystem/uds/<8 hex>/exclusiveConn, and a socket
# path holds at most 107 bytes: a longer stateDir makes every worker exit at start.
WORKER_SUBDIR = "yuanrong"  # the worker's fixed working directory under stateDir
UDS_SUFFIX = f"/{WORKER_SUBDIR}/datasystem/uds/01234567/exclusiveConn"
UDS_PATH_MAX = 107
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

    @property
    def name(self) -> str:
        return f"{self.role}-{self.instance}-r{self.dp_rank}"

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
        return json.dumps({"prefill": [f"http://{h}:{p}" for h, p in self.prefillers],
                           "decode": [f"http://{h}:{p}" for h, p in self.decoders]}, separators=(",", ":"))


@dataclass(frozen=True)
class Plan:
    stack: str
    cfg: StackConfig = field(repr=False)
    nodes: tuple[NodePlan, ...]
    instances: tuple[Instance, ...]
    etcd: EtcdPlan
    workers: tuple[WorkerPlan, ...]
    proxy: ProxyPlan

    @property
    def ranks(self) -> tuple[Rank, ...]:
        return tuple(r for i in self.instances for r in i.ranks)

    def node(self, name: str) -> NodePlan:
        return next(n for n in self.nodes if n.name == name)

    def worker(self, node: str) -> WorkerPlan:
        return next(w for w in self.workers if w.node == node)

    def instances_of(self, role: str) -> tuple[Instance, ...]:
        return tuple(i for i in self.instances if i.role == role)

    def ranks_of(self, role: str) -> tuple[Rank, ...]:
        return tuple(r for i in self.instances_of(role) for r in i.ranks)

    def instance_on(self, node: str) -> Optional[Instance]:
        """The instance whose ranks run on `node` (a node serves at most one), or None."""
        return next((i for i in self.instances if node in i.nodes), None)

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
# Validation


def _check_flag_keys(problems: list[Problem], where: tuple, flags: dict) -> None:
    # Keys arrive normalised (`tensor_parallel_size` -> `tensor-parallel-size`, valuetypes.FlagKey).
    for key in flags:
        if key in DERIVED_FLAGS:
            problems.append(
                Problem(setting(*where, key), f"--{key} is derived by ascend-pd", DERIVED_FLAGS[key])
            )


def _check_env_keys(problems: list[Problem], where: tuple, env: dict) -> None:
    for key, value in env.items():
        if key in DERIVED_ENV:
            problems.append(Problem(setting(*where, key), f"{key} is derived by ascend-pd", DERIVED_ENV[key]))
        if "$(" in str(value) or "`" in str(value):
            problems.append(
                Problem(setting(*where, key), "command substitution is not allowed in env values",
                        "write the literal value; only $NAME / ${NAME} references are expanded")
            )


def _protected_mounts(cfg: StackConfig) -> tuple[str, ...]:
    """Container paths whose contents live on the host: the bind mounts."""
    mounts = [c for _, c in DEFAULT_MOUNTS] + [m.container for m in cfg.container.extra_mounts]
    return tuple(m.rstrip("/") or "/" for m in mounts)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _check_owned_paths(p: list[Problem], cfg: StackConfig) -> None:
    """Paths ascend-pd writes and removes must not be (or contain) a system tree, a host mount or the
    weights: destroy runs `rm -rf` on them."""
    protected = _protected_mounts(cfg)
    model = cfg.model.path.rstrip("/") or "/"
    owned = ((("etcd", "dataDir"), cfg.etcd.data_dir), (("stateDir",), cfg.state_dir),
             (("yuanrong", "livenessPath"), cfg.yuanrong.liveness_path))
    for where, path in owned:
        why = owned_path_problem(path, protected)
        mine = path.rstrip("/") or "/"
        if why is None and (_inside(mine, model) or _inside(model, mine)):
            why = f"overlaps the model weights (ascend-pd:model.path {cfg.model.path})"
        if why:
            p.append(Problem(setting(*where), f"{path!r} {why}; ascend-pd writes and deletes this path",
                             "use a directory of its own, e.g. /workspace/ascend-pd or /tmp/etcd-data"))
    state = cfg.state_dir.rstrip("/")
    for where, path in owned[0:1] + owned[2:3]:
        if path.rstrip("/") == state:
            p.append(Problem(setting(*where), f"{path!r} is ascend-pd:stateDir itself", "use a path of its own"))


def _validate(cfg: StackConfig) -> list[Problem]:
    p: list[Problem] = []
    names = [n.name for n in cfg.nodes]
    addresses = [n.address for n in cfg.nodes]
    former = [(i, f) for i, n in enumerate(cfg.nodes) for f in n.former_names]
    for i, n in enumerate(cfg.nodes):
        if names.count(n.name) > 1 and names.index(n.name) != i:
            p.append(Problem(setting("nodes", i, "name"), f"node name {n.name!r} is used twice",
                             "give every node a unique name"))
        if n.name == MONITORING_DIR:
            # `render --out DIR` writes DIR/<node>/ and the Prometheus files in DIR/monitoring/.
            p.append(Problem(setting("nodes", i, "name"), f"{n.name!r} is the name of render's Prometheus directory",
                             "give the node another name"))
        if addresses.count(n.address) > 1 and addresses.index(n.address) != i:
            p.append(Problem(setting("nodes", i, "address"), f"address {n.address} is used twice",
                             "give every node its own address"))
    for i, old in former:
        if old in names or [f for _, f in former].count(old) > 1:
            p.append(Problem(setting("nodes", i, "formerNames"), f"{old!r} names another node (now or before)",
                             "list each earlier name once, on the node that had it"))

    seen_role: dict[str, str] = {}
    for role in ROLES:
        r: Role = getattr(cfg, role)
        for j, node in enumerate(r.nodes):
            if node not in names:
                p.append(Problem(setting(role, "nodes", j), f"unknown node {node!r}",
                                 f"use one of the names in ascend-pd:nodes: {names}"))
            elif node in seen_role:
                other = seen_role[node]
                p.append(Problem(setting(role, "nodes", j),
                                 f"node {node!r} is already assigned to {other}",
                                 "assign every node to at most one role, once"))
            else:
                seen_role[node] = role
        if len(r.nodes) % r.nodes_per_instance:
            p.append(Problem(setting(role, "nodesPerInstance"),
                             f"{len(r.nodes)} nodes cannot be split into instances of {r.nodes_per_instance}",
                             f"list a multiple of {r.nodes_per_instance} nodes in ascend-pd:{role}.nodes"))
        if r.dp % r.nodes_per_instance:
            p.append(Problem(setting(role, "dp"),
                             f"dp {r.dp} is not divisible by nodesPerInstance {r.nodes_per_instance}",
                             "make dp a multiple of nodesPerInstance (each node runs dp/nodesPerInstance ranks)"))
        else:
            local = r.dp // r.nodes_per_instance
            if local * r.tp > cfg.npus:
                p.append(Problem(setting(role, "tp"),
                                 f"{local} local DP ranks x tp {r.tp} = {local * r.tp} NPUs, "
                                 f"but {cfg.hardware} has {cfg.npus} per node",
                                 "lower dp or tp, or raise nodesPerInstance"))
            if r.port_base + local - 1 > 65535:
                p.append(Problem(setting(role, "portBase"),
                                 f"{local} local ranks from port {r.port_base} run past 65535 (to {r.port_base + local - 1})",
                                 f"use a portBase of at most {65536 - local}"))
        _check_flag_keys(p, (role, "flags"), r.flags)
        _check_env_keys(p, (role, "env"), r.env)
    _check_flag_keys(p, ("vllm", "flags"), cfg.vllm.flags)
    _check_env_keys(p, ("vllm", "env"), cfg.vllm.env)
    for key in cfg.yuanrong.flags:
        if key in DERIVED_WORKER_FLAGS:
            p.append(Problem(setting("yuanrong", "flags", key), f"--{key} is derived by ascend-pd",
                             DERIVED_WORKER_FLAGS[key]))

    if cfg.prefill.tp < cfg.decode.tp:
        p.append(Problem(setting("prefill", "tp"),
                         f"prefill tp {cfg.prefill.tp} < decode tp {cfg.decode.tp}; Mooncake requires prefill tp >= decode tp",
                         "raise ascend-pd:prefill.tp or lower ascend-pd:decode.tp"))
    direct = mooncake_direct_range(cfg.npus)
    for role in ROLES:
        r = getattr(cfg, role)
        last = r.kv_port + r.dp * r.tp - 1  # side channels kv_port + rank*tp + t, every global DP rank
        if r.kv_port <= direct[-1] and last >= direct[0]:
            p.append(Problem(setting(role, "kvPort"),
                             f"{role} side-channel ports {r.kv_port}-{last} overlap Mooncake's AscendDirect range "
                             f"{direct[0]}-{direct[-1]} (both ends inclusive) on {cfg.npus}-NPU nodes "
                             "(random 'ZMQError: Address already in use' at startup)",
                             f"use a kvPort >= {direct[-1] + 1}"))
        if last > 65535:
            p.append(Problem(setting(role, "kvPort"), f"side-channel ports run past 65535 (to {last})",
                             f"use a kvPort of at most {65536 - r.dp * r.tp}"))
    if cfg.prefill.kv_port == cfg.decode.kv_port:
        p.append(Problem(setting("decode", "kvPort"),
                         f"prefill and decode both use kv_port {cfg.decode.kv_port}",
                         "give decode its own kvPort"))

    y = cfg.yuanrong
    if y.node_dead_timeout_s <= y.node_timeout_s:
        p.append(Problem(setting("yuanrong", "nodeDeadTimeoutS"),
                         f"{y.node_dead_timeout_s} must exceed nodeTimeoutS {y.node_timeout_s}",
                         f"set it above {y.node_timeout_s} (the seeds use 2x)"))
    if y.huge_tlb:
        have = cfg.hugepages.gib * 1024 if cfg.hugepages else 0
        if have < y.shared_memory_mb:
            p.append(Problem(setting("yuanrong", "hugeTlb"),
                             f"huge TLB needs huge pages >= sharedMemoryMb {y.shared_memory_mb} MiB, "
                             f"but ascend-pd:hugepages gives {have} MiB",
                             f"set ascend-pd:hugepages.gib to at least {-(-y.shared_memory_mb // 1024)} or turn hugeTlb off"))
    if docker_size_mib(cfg.container.shm_size) < y.shared_memory_mb:
        p.append(Problem(setting("container", "shmSize"),
                         f"{cfg.container.shm_size} is smaller than the worker's sharedMemoryMb {y.shared_memory_mb} MiB",
                         f"set shmSize to at least {-(-y.shared_memory_mb // 1024)}g"))
    # Compared with the defaults, not with what was written: a full dump of a config stays valid.
    e, etcd_defaults = cfg.etcd, type(cfg.etcd).model_fields
    if e.image is not None:
        if e.version != etcd_defaults["version"].default:
            p.append(Problem(setting("etcd", "version"), "only picks the release installed in binary mode; "
                             f"with etcd.image the image ({e.image}) fixes the version",
                             "remove etcd.version, or remove etcd.image to install that release"))
        if e.container_name == cfg.container.name:
            p.append(Problem(setting("etcd", "containerName"),
                             f"{e.container_name!r} is also the NPU container's name (container.name)",
                             "give the etcd container its own name"))
    elif e.container_name != etcd_defaults["container_name"].default:
        p.append(Problem(setting("etcd", "containerName"), "only used with etcd.image",
                         "set etcd.image, or remove etcd.containerName"))
    for j, dev in enumerate(y.rh2d_device_ids):
        if not 0 <= dev < cfg.npus:
            p.append(Problem(setting("yuanrong", "rh2dDeviceIds", j), f"device {dev} does not exist",
                             f"use ids 0..{cfg.npus - 1}"))
    for key, where in ((cfg.etcd.node, ("etcd", "node")), (cfg.proxy.node, ("proxy", "node"))):
        if key not in names:
            p.append(Problem(setting(*where), f"unknown node {key!r}", f"use one of {names}"))
    if len(cfg.state_dir.encode()) + len(UDS_SUFFIX) > UDS_PATH_MAX:
        p.append(Problem(setting("stateDir"),
                         f"{cfg.state_dir!r} makes the worker's unix socket paths longer than {UDS_PATH_MAX} bytes",
                         f"use a directory of at most {UDS_PATH_MAX - len(UDS_SUFFIX)} characters"))
    _check_owned_paths(p, cfg)
    step_names = [step_name(s) for s in cfg.container.prepare]
    for j, name in enumerate(step_names):
        if step_names.index(name) != j:
            p.append(Problem(setting("container", "prepare", j), f"a second step named {name!r}",
                             "merge it into the earlier step with the same package or repository"))
    for key in cfg.ssh.host_keys:
        if key not in names:
            p.append(Problem(setting("ssh", "hostKeys", key), "unknown node", f"use one of {names}"))
    _check_monitoring(p, cfg, names)
    if not p:
        p.extend(_port_collisions(cfg))
    return p


def _check_monitoring(p: list[Problem], cfg: StackConfig, names: list[str]) -> None:
    """The settings of the Prometheus `pulumi up` runs on `monitoring.node` (none when it is unset: only
    `render --out` uses the rest). Its port is checked with every other port (_port_collisions)."""
    m = cfg.monitoring
    if m.node is None:
        return
    if m.node not in names:
        near = did_you_mean(m.node, names)
        p.append(Problem(setting("monitoring", "node"), f"unknown node {m.node!r}",
                         (f"did you mean '{near}'? Otherwise use" if near else "use")
                         + f" one of the names in ascend-pd:nodes: {names}, or remove monitoring.node"))
    # Host paths: the config dir is removed by destroy, the data dir written by Prometheus.
    why = owned_path_problem(m.dir, _protected_mounts(cfg))
    mine, model = m.dir.rstrip("/") or "/", cfg.model.path.rstrip("/") or "/"
    if why is None and (_inside(mine, model) or _inside(model, mine)):
        why = f"overlaps the model weights (ascend-pd:model.path {cfg.model.path})"
    if why:
        p.append(Problem(setting("monitoring", "dir"), f"{m.dir!r} {why}; ascend-pd writes it and destroy deletes "
                         "its config/", "use a directory of its own, e.g. /var/lib/ascend-pd/prometheus"))
    taken = {cfg.container.name: "the NPU container's name (container.name)"}
    if cfg.etcd.image is not None and cfg.etcd.node == m.node:
        taken[cfg.etcd.container_name] = "etcd's container on the same node (etcd.containerName)"
    if m.container_name in taken:
        p.append(Problem(setting("monitoring", "containerName"),
                         f"{m.container_name!r} is also {taken[m.container_name]}",
                         "give the Prometheus container its own name"))
    if m.node_exporter_port is not None and m.port == m.node_exporter_port:
        p.append(Problem(setting("monitoring", "port"), f"port {m.port} on node {m.node} is also the node_exporter's "
                         "(monitoring.nodeExporterPort), which Prometheus scrapes on every node",
                         "give Prometheus another port"))
    node = next((n for n in cfg.nodes if n.name == m.node), None)
    if m.exporter is not None and node is not None:
        host, _, port = m.exporter.rpartition(":")
        if host in (node.name, node.address) and int(port) == m.port:
            p.append(Problem(setting("monitoring", "port"), f"port {m.port} on node {m.node} is also `ascend-pd "
                             f"exporter`'s (monitoring.exporter {m.exporter})", "give Prometheus another port"))


def _port_collisions(cfg: StackConfig) -> list[Problem]:
    """Every fixed TCP port per node, checked together (and against Mooncake's random range)."""
    used: dict[str, dict[int, tuple[str, str]]] = {n.name: {} for n in cfg.nodes}
    problems: list[Problem] = []

    def claim(node: str, port: int, owner: str, where: str) -> None:
        other = used[node].get(port)
        if other is not None and other[0] != owner:
            problems.append(Problem(where, f"port {port} on node {node} is also used by {other[0]} ({other[1]})",
                                    "give the two services different ports"))
        used[node][port] = (owner, where)

    for n in cfg.nodes:
        claim(n.name, cfg.yuanrong.port, "the openYuanrong worker", setting("yuanrong", "port"))
    claim(cfg.etcd.node, cfg.etcd.client_port, "etcd client", setting("etcd", "clientPort"))
    claim(cfg.etcd.node, cfg.etcd.peer_port, "etcd peer", setting("etcd", "peerPort"))
    claim(cfg.proxy.node, cfg.proxy.port, "the PD proxy", setting("proxy", "port"))
    side_channels = {f"{role} Mooncake side channel" for role in ROLES}
    for role in ROLES:
        r: Role = getattr(cfg, role)
        local = r.dp // r.nodes_per_instance
        for k in range(0, len(r.nodes), r.nodes_per_instance):
            group = r.nodes[k : k + r.nodes_per_instance]
            claim(group[0], r.rpc_port, f"{role} DP RPC", setting(role, "rpcPort"))
            for pos, node in enumerate(group):
                for i in range(local):
                    claim(node, r.port_base + i, f"{role} rank port", setting(role, "portBase"))
                    rank = pos * local + i
                    for t in range(r.tp):
                        claim(node, r.kv_port + rank * r.tp + t, f"{role} Mooncake side channel",
                              setting(role, "kvPort"))
    if cfg.monitoring.node is not None:  # last: a clash names monitoring.port, the setting that moves it
        claim(cfg.monitoring.node, cfg.monitoring.port, "Prometheus", setting("monitoring", "port"))
    direct = mooncake_direct_range(cfg.npus)
    rank_nodes = set(cfg.prefill.nodes) | set(cfg.decode.nodes)
    for node in sorted(rank_nodes):
        for port, (owner, where) in sorted(used[node].items()):
            if port in direct and owner not in side_channels:
                problems.append(Problem(where,
                                        f"{owner} port {port} on node {node} lies in Mooncake's AscendDirect range "
                                        f"{direct[0]}-{direct[-1]}",
                                        f"move it below {direct[0]} or above {direct[-1]}"))
    return problems


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
            "backend": "yuanrong",
        },
    }
    parent: dict = {"kv_connector": "MultiConnector", "kv_role": kv_role}
    if role == "prefill":
        # Unique per prefill instance (the A2 seed gives all four "0"); never inside a child.
        parent["engine_id"] = str(instance)
    parent["kv_connector_extra_config"] = {"connectors": [mooncake, store]}
    return parent


def _rank_env(cfg: StackConfig, role: str, node, devices: tuple[int, ...]) -> tuple[tuple[str, str], ...]:
    r: Role = getattr(cfg, role)
    env: dict[str, str] = {}
    # Key order: the stack file's order of `env` keys means nothing (values expand from the
    # container's environment, never from each other), so it must not change a fingerprint.
    for k, v in sorted({**cfg.vllm.env, **r.env}.items()):
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


def node_image(cfg: StackConfig, roles: Sequence[str]) -> str:
    """The image of a node's NPU container: that of the role it serves (a node serves at most one),
    else container.image (a node with only etcd or the proxy)."""
    return next((getattr(cfg, r).image for r in ROLES if r in roles and getattr(cfg, r).image), cfg.container.image)


def build_plan(cfg: StackConfig, stack: str) -> Plan:
    problems = _validate(cfg)
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
            "--listen-peer-urls", f"http://{ea}:{e.peer_port}",
            "--initial-advertise-peer-urls", f"http://{ea}:{e.peer_port}",
            "--initial-cluster", f"etcd-single=http://{ea}:{e.peer_port}",
        ),
    )
    instances = _instances(cfg, "prefill") + _instances(cfg, "decode")
    pre = tuple((r.address, r.port) for i in instances if i.role == "prefill" for r in i.ranks)
    dec = tuple((r.address, r.port) for i in instances if i.role == "decode" for r in i.ranks)
    pa = nodes[cfg.proxy.node].address
    launcher = (f"{run_dir_of(cfg)}/{PROXY_LAUNCHER}",) if cfg.proxy.keep_removed_out else ()
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
                workers=workers, proxy=proxy)


__all__ = [
    "Plan", "NodePlan", "Rank", "Instance", "EtcdPlan", "WorkerPlan", "ProxyPlan", "build_plan",
    "kv_transfer_config", "DERIVED_FLAGS", "DERIVED_ENV", "UNSET_ENV", "ROLES",
]
