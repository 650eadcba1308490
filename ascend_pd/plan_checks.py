"""What the plan derives and the checks of a whole StackConfig before it does (every problem at once, each
naming its setting and the fix): the rules that change with the settings, apart from the derivation in plan.py."""

from __future__ import annotations

from .config import DEFAULT_MOUNTS, MONITORING_DIR, Role, StackConfig, docker_size_mib, step_name
from .errors import Problem, did_you_mean, setting
from .secrets import env_allowed, placeholders
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
# The worker's unix sockets live at <workdir>/datasystem/uds/<8 hex>/exclusiveConn, and a socket
# path holds at most 107 bytes: a longer stateDir makes every worker exit at start.
WORKER_SUBDIR = "yuanrong"  # the worker's fixed working directory under stateDir
UDS_SUFFIX = f"/{WORKER_SUBDIR}/datasystem/uds/01234567/exclusiveConn"
UDS_PATH_MAX = 107


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
    mounts = [c for _, c, _ in DEFAULT_MOUNTS] + [m.container for m in cfg.container.extra_mounts]
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


def _validate(cfg: StackConfig, stack: str = "<stack>") -> list[Problem]:
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
    unpinned = [n for n in names if n not in cfg.ssh.host_keys]
    if unpinned and not cfg.ssh.insecure_ignore_host_keys:
        p.append(Problem(setting("ssh", "hostKeys"), f"no pinned host key for {', '.join(unpinned)}: pulumi-command "
                         "would accept any key from those addresses, and a first `pulumi up` could be intercepted",
                         f"run `ascend-pd doctor --stack {stack} --print-host-keys`, check each key on the node itself "
                         "(ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub on its console) and add them under "
                         "ascend-pd:ssh.hostKeys; or, for a throw-away cluster, set ascend-pd:ssh.insecureIgnoreHostKeys: true"))
    _check_monitoring(p, cfg, names)
    _check_secrets(p, cfg)
    if not p:
        p.extend(_port_collisions(cfg))
    return p


def _check_secrets(p: list[Problem], cfg: StackConfig) -> None:
    """A secret value only where the program can deliver it beside the scripts (ascend_pd/secrets.py)."""
    data = cfg.model_dump(by_alias=True)
    for path in placeholders(data):
        if env_allowed(path):
            continue
        where = setting(*path)
        if len(path) > 1 and path[1] == "flags":
            why, fix = ("a flag is on every rank's command line, which `ps` on the node shows",
                        "pass it in an environment variable and encrypt that (vLLM reads --api-key from "
                        "VLLM_API_KEY): pulumi config set --secret --path 'ascend-pd:vllm.env.VLLM_API_KEY' ...")
        elif path[:2] == ("container", "env"):
            why, fix = ("the container's environment is its configuration, which `docker inspect` and the state show",
                        "give the processes that need it a rank variable (vllm.env, prefill.env, decode.env) instead")
        else:
            why, fix = ("ascend-pd writes this setting into the scripts the nodes run",
                        "keep secrets in a rank's environment (vllm.env, prefill.env, decode.env) or proxyApiKey")
        p.append(Problem(where, f"is a secret, but {why}", fix))


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
