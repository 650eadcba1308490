"""What operators write: the `ascend-pd:*` keys of a `Pulumi.<stack>.yaml`, as strict pydantic models.

Keys are camelCase in the stack file (Pulumi's convention); every model forbids unknown keys so a
typo is an error instead of a silently ignored setting. Defaults live here, as named constants with
the reason beside them, so the stack files hold only what differs per cluster.

Nothing here imports pulumi: the same models load a stack file for `render` and `status`.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Optional, Sequence, Union

from pydantic import ConfigDict, Field, field_validator, model_validator

from .valuetypes import (SECONDS, AbsPath, Command, CountOrPercent, DockerName, EnvName, EtcdVersion, FilePath, FlagKey, HostKey,
                         HostPort, ImageRef, Interleave, IPv4, IPv4Net, ModelName, Name, Nic, OwnedFile, OwnedPath, Port,
                         PythonIdentifier, PythonModule, ReleaseName, Seconds, Settings, SoftwareVersion, SshUser, Text, Word,
                         WorkerFlagKey)

PROJECT = "ascend-pd"
MONITORING_DIR = "monitoring"  # render --out <out> writes under <out>/monitoring

# AscendStoreConnector's storage backend for the KV pool: the openYuanrong Datasystem workers.
KV_POOL_BACKEND = "yuanrong"

# NPUs per server of each supported hardware profile (Atlas 800I A2: 8 x 64 GB; Atlas 800 A3: 16 dies).
HARDWARE_NPUS = {"atlas-800i-a2": 8, "atlas-800-a3": 16}

# Where everything ascend-pd starts inside a container keeps its pid files, logs and working dirs.
# /workspace is container-local (not a host mount), so replacing the container starts clean.
DEFAULT_STATE_DIR = "/workspace/ascend-pd"

# The seeds' start-docker.sh mounts, minus /tmp-style scratch the program does not rely on being shared:
# (host, container, read-only). The guides mount all of them read-write, but nothing in the container
# writes the driver, dcmi, npu-smi, /usr/local/sbin (on root's PATH), /etc/hccn.conf or the install info
# (the guides run hccn_tool on the host): read-only, so a process in the privileged container cannot
# rewrite what the host runs. /home, /mnt, /tmp and /data stay writable: the weights, the A3 guide's
# patches and whatever the operator keeps there.
DEFAULT_MOUNTS = (
    ("/usr/local/Ascend/driver", "/usr/local/Ascend/driver", True),
    ("/usr/local/dcmi", "/usr/local/dcmi", True),
    ("/usr/local/bin/npu-smi", "/usr/local/bin/npu-smi", True),
    ("/etc/ascend_install.info", "/etc/ascend_install.info", True),
    ("/usr/local/sbin", "/usr/local/sbin", True),
    ("/etc/hccn.conf", "/etc/hccn.conf", True),
    ("/home", "/home", False),
    ("/mnt", "/mnt", False),
    ("/tmp", "/tmp", False),
    ("/data", "/data", False),
    ("/usr/share/zoneinfo/Asia/Shanghai", "/etc/localtime", True),
)
# The seeds work in an interactive `docker exec -it <container> bash`, whose ~/.bashrc and
# /etc/profile source CANN's environment scripts; the non-interactive shell ascend-pd runs reads
# neither, so container scripts source them explicitly (skipping absent ones).
DEFAULT_ENV_FILES = (
    "/usr/local/Ascend/ascend-toolkit/set_env.sh",
    "/usr/local/Ascend/nnal/atb/set_env.sh",
)
DEFAULT_DEVICES = ("/dev/davinci_manager", "/dev/hisi_hdc", "/dev/devmm_svm")
# pulumi-command dials SSH 10 times, 15 s each, by default: a node rebooting mid-`up` outlasts that.
# 40 x 15 s rides out a server reboot (BMC POST on these machines takes minutes).
DEFAULT_DIAL_ERROR_LIMIT = 40
DEFAULT_PER_DIAL_TIMEOUT_S = 15
# A node's retransmissions to a silent peer: 8 gives up after about 100 s with the kernel's 200 ms
# minimum RTO (RFC 1122 asks for at least 100 s), where the default 15 holds on for about 15 minutes.
DEFAULT_TCP_RETRIES2 = 8
# Minimum CANN and driver (HDK) releases per profile, from the seeds: seed 000 (A2) CANN >= 8.5.0,
# HDK >= 25.2.3, and HDK >= 25.5.0 when RH2D is on; seed 003 (A3) CANN >= 8.5.0, HDK >= 25.5.0.
MIN_CANN = {"atlas-800i-a2": "8.5.0", "atlas-800-a3": "8.5.0"}
MIN_DRIVER = {"atlas-800i-a2": "25.2.3", "atlas-800-a3": "25.5.0"}
MIN_DRIVER_RH2D = "25.5.0"
# Host RAM (MemTotal, GiB) the seed guides assume: seed 003 (A3) asks for 1 T; seed 000 (A2) names none.
# MemTotal is physical RAM less what firmware and kernel keep: a 1 TiB server reads 1000-1010 GiB.
MIN_HOST_MEMORY_GIB = {"atlas-800i-a2": 0, "atlas-800-a3": 960}
# pulumi-docker pulls under a 20-minute default; a vLLM-Ascend image is 15-30 GB.
DEFAULT_PULL_TIMEOUT_S = 2 * 3600

FlagValue = Union[bool, int, float, Text, dict, list, None]
EnvValue = Union[Text, int, float, bool]


_Model = Settings


class Node(_Model):
    """One server."""

    name: Name = Field(description="Logical node name, used in resource names, URNs and the role, etcd and proxy "
                                   "settings. Renaming a node creates its resources anew unless the old name is "
                                   "listed in `formerNames`.")
    address: IPv4 = Field(description="Business-network IPv4 address: the node's services bind it, the other nodes "
                                      "and SSH reach it. Changing it replaces the node's container and everything in "
                                      "it.")
    nic: Nic = Field(description="Business NIC of the node, given to every rank as `HCCL_SOCKET_IFNAME`, "
                                 "`GLOO_SOCKET_IFNAME` and `TP_SOCKET_IFNAME` (e.g. `enp67s0f0np0`).")
    former_names: list[Name] = Field(
        default_factory=list,
        description="Earlier names of this node: its resources keep their identity (Pulumi aliases) instead "
        "of being created anew beside the old ones.",
    )


class Ssh(_Model):
    """How Pulumi reaches every node. The private key, if any, is the secret `ascend-pd:sshPrivateKey`."""

    user: SshUser = Field("root", description="User both providers log in as on every node; it must run `docker` and "
                                              "write `/proc/sys/vm/nr_hugepages`.")
    port: Port(ge=1) = Field(22, description="SSH port of every node (the same on all of them).")
    host_keys: dict[Name, HostKey] = Field(
        default_factory=dict,
        description="Pinned host public key of every node, by node name, that pulumi-command and `doctor` verify "
                    "(e.g. `ssh-ed25519 AAAA...`; RSA keys are refused). Required for every node: without one "
                    "pulumi-command accepts any key, and the first `pulumi up` can be intercepted. "
                    "`ascend-pd doctor --stack S --print-host-keys` prints what the nodes present, to verify and "
                    "pin. pulumi-docker checks `~/.ssh/known_hosts` (the same command prints those lines).",
    )
    insecure_ignore_host_keys: bool = Field(False, description=(
        "Deploy although nodes have no pinned `hostKeys` (pulumi-command then accepts any host key): for a "
        "throw-away cluster only."))
    dial_error_limit: int = Field(DEFAULT_DIAL_ERROR_LIMIT, strict=True, ge=1, le=1000,
                                  description="SSH connection attempts of pulumi-command before a command fails; "
                                              "with `perDialTimeoutS` it sets how long a rebooting node may stay "
                                              "unreachable during `pulumi up` (40 × 15 s = 10 minutes).")
    per_dial_timeout_s: Seconds(ge=1) = Field(DEFAULT_PER_DIAL_TIMEOUT_S, description=(
        "Timeout of one SSH connection attempt of pulumi-command, in seconds."))


class Mount(_Model):
    """A bind mount of the NPU container."""

    host: AbsPath = Field(description="Path on the node to mount into the container.")
    container: AbsPath = Field(description="Where the mounted path appears inside the container.")
    read_only: bool = Field(False, description="Mount it read-only instead of read-write.")


class PipStep(_Model):
    """`pip install <args>` inside the container (the A3 guide's transformers upgrade)."""

    pip: list[Text] = Field(min_length=1, description="Arguments of one `pip install` run in every container, one "
                                                      "per item, e.g. `[transformers==5.2.0, --no-deps]`.")


class PatchStep(_Model):
    """`git am` a list of patch files (paths inside the container) onto a repository."""

    repo: AbsPath = Field(description="Git repository inside the container that the patches apply to, e.g. "
                                      "`/vllm-workspace/vllm-ascend`.")
    patches: list[FilePath] = Field(min_length=1, description=(
        "Patch files inside the container, applied in order with `git am` (once) and reverted on destroy."))


class Container(_Model):
    """The long-lived NPU container on every node (the seeds' start-docker.sh)."""

    name: DockerName = Field(description="Fixed container name on every node; every script reaches the container by "
                                         "it (`docker exec`). Changing it replaces the container and everything in "
                                         "it.")
    image: ImageRef = Field(description="vLLM-Ascend image of the container, e.g. "
                                        "`quay.io/ascend/vllm-ascend:v0.20.2rc1`; pulled on every node and kept "
                                        "there on destroy. Changing it replaces the container and restarts "
                                        "everything in it.")
    shm_size: Text = Field(description="The container's `--shm-size`, a docker size such as `800g` or `512000m`; "
                                       "must hold the worker's `yuanrong.sharedMemoryMb`.")
    extra_mounts: list[Mount] = Field(default_factory=list, description=(
        "Bind mounts beyond the seeds' set (the driver, `npu-smi`, `/home`, `/mnt`, `/tmp`, `/data`, ...), e.g. "
        "weights stored elsewhere."))
    env: dict[EnvName, Text] = Field(default_factory=dict, description=(
        "Environment of the container itself, e.g. `http_proxy` for the `pip` steps; the services ascend-pd starts "
        "run with proxy variables unset."))
    prepare: list[Union[PipStep, PatchStep]] = Field(
        default_factory=list, description="Steps run once in every container after it is created, in order: "
                                          "`{pip: [...]}` runs `pip install`, `{repo, patches}` applies patch files. "
                                          "Each step is named by its content, so inserting one renames nothing."
    )
    env_files: list[FilePath] = Field(
        default_factory=lambda: list(DEFAULT_ENV_FILES),
        description="Scripts sourced (if present) before anything Python or NPU-related starts in the container: "
                    "CANN's environment, which the non-interactive shell ascend-pd runs does not read from "
                    "`~/.bashrc`.",
    )
    pull_timeout_s: Seconds(ge=60) = Field(
        DEFAULT_PULL_TIMEOUT_S, description="Deadline of the image pull on each node, in seconds (pulumi-docker's "
                                            "own 20 minutes are too short for a 15–30 GB image).")

    @field_validator("shm_size")
    @classmethod
    def _size(cls, v: str) -> str:
        if not re.fullmatch(r"[0-9]{1,12}[kmg]?", v.strip().lower()):
            raise ValueError(f"{v!r} is not a docker size like 800g or 512000m")
        return v.strip().lower()


class Model(_Model):
    """The model every rank serves."""

    path: AbsPath = Field(description="Directory of the model weights inside the container, passed to every "
                                      "`vllm serve`; the weights must be there on every rank's node.")
    served_name: ModelName = Field(description="Name the model is served as (`--served-model-name`): what clients "
                                               "put in a request's `model`.")


class Vllm(_Model):
    """Settings shared by both roles."""

    flags: dict[FlagKey, FlagValue] = Field(
        default_factory=dict, description="vLLM flags of both roles: flag name (without `--`) → value; `true` is a "
                                          "bare flag, objects become JSON, `null` or `false` drops the flag, `$NAME` "
                                          "references expand. Derived flags are refused (see below)."
    )
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, description=(
        "Environment of every rank of both roles; `$NAME` and `${NAME}` references expand, command substitution is "
        "refused."))
    ready_timeout_s: Seconds(ge=60) = Field(
        3600, description="Deadline, in seconds, for every rank of a node to answer `/health` after its launch; also "
                          "the ranks' `VLLM_ENGINE_READY_TIMEOUT_S`. Raise it for models that load slower."
    )
    stop_timeout_s: Seconds(ge=5) = Field(60, description=(
        "Seconds between TERM and KILL when ranks are stopped (a changed flag, a topology change, destroy)."))
    allow_unknown_flags: list[FlagKey] = Field(default_factory=list, description=(
        "Flag names (without `--`) that `vllm.flags`, `prefill.flags` and `decode.flags` may use although "
        "ascend-pd does not know them: a flag of a newer vLLM or of a plugin. Any other name that `vllm serve` "
        "of the pinned releases does not accept is refused, with the closest known flag."))


class VllmAscend(_Model):
    """Which vllm-ascend release the images run: every rank's command is checked against its facts."""

    release: Optional[ReleaseName] = Field(None, description=(
        "The vllm-ascend release of the images whose tags do not name one (an image pinned by digest, a private "
        "tag), e.g. `0.23.0.post1`. The release picks the facts every rank's command, the proxy and the worker "
        "wheel are checked against before anything deploys (`ascend_pd/data/releases/`). Unset: each image's tag "
        "names it (`v0.20.2rc1`, `v0.18.0-a3`)."))
    strict: bool = Field(False, description=(
        "Refuse what the release checks only warn about: a flag key or environment variable the release does not "
        "read, a key at the wrong level of `additional-config`, a deprecated value."))


class Role(_Model):
    """Prefill or decode: `instances` DP groups of `dp` ranks with TP `tp` each."""

    nodes: list[Name] = Field(min_length=1, description="Node names of this role, in instance order: every "
                                                        "`nodesPerInstance` consecutive nodes form one DP instance, "
                                                        "whose first node is its DP master.")
    nodes_per_instance: int = Field(1, ge=1, le=256, description=(
        "Nodes one DP instance spans; the number of `nodes` must be a multiple of it, and `dp` divisible by it."))
    dp: int = Field(ge=1, le=4096, description="Data-parallel size of ONE instance (not of the role): each of its "
                                               "nodes runs dp / nodesPerInstance local ranks.")
    tp: int = Field(ge=1, le=64, description="Tensor-parallel size of every rank: a rank uses tp NPUs, and local "
                                             "ranks × tp must fit the node's NPUs. Prefill tp must be at least "
                                             "decode tp (Mooncake).")
    port_base: Port() = Field(description="HTTP port of each node's first local rank; local rank i listens on "
                                          "portBase + i.")
    rpc_port: Port() = Field(description="DP RPC port on each instance's first node (`--data-parallel-rpc-port`), "
                                         "through which the instance's ranks coordinate.")
    kv_port: Port() = Field(description="Mooncake connector `kv_port`. Prefill rank r binds the side channels kvPort "
                                        "+ r·tp ... kvPort + (r+1)·tp − 1, which must lie above the AscendDirect "
                                        "range (above 28000 on A2, 36000 on A3); decode's must differ from "
                                        "prefill's.")
    connector: PythonIdentifier = Field(
        "MooncakeConnectorV1", description="Class of the Mooncake connector inside the MultiConnector (the KV "
                                           "transfer between prefill and decode)."
    )
    connector_module_path: Optional[PythonModule] = Field(
        None, description="`kv_connector_module_path` of the Mooncake connector, for a connector outside vLLM's "
                          "registry; unset: not passed."
    )
    flags: dict[FlagKey, FlagValue] = Field(default_factory=dict, description=(
        "vLLM flags of this role only, over `vllm.flags` (same syntax); `null` drops a common flag."))
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, description=(
        "Environment of this role's ranks, over `vllm.env` (same syntax)."))
    image: Optional[ImageRef] = Field(None, description=(
        "Image of the containers of this role's nodes, over `container.image`; unset: `container.image`. "
        "Changing it replaces only those containers, one instance at a time (`rollout.maxUnavailable`), each "
        "drained out of the proxy first, so a role with a spare instance keeps serving; put etcd and the proxy "
        "on a node of the other role, or that node's replacement stops them too (docs/changes.md)."))


class Yuanrong(_Model):
    """openYuanrong Datasystem worker on every node (dscli start)."""

    package: Word = Field(
        "openyuanrong-datasystem", description="What pip installs as the worker in each container: a requirement "
                                               "such as `openyuanrong-datasystem==0.8.1`, or a wheel URL."
    )
    port: Port() = Field(18481, description="TCP port of the worker on every node; the ranks find it through "
                                            "`DS_WORKER_ADDR` = node address:port.")
    shared_memory_mb: int = Field(ge=64, le=64 * 1024 * 1024, description=(
        "Shared memory of each node's worker in MiB (`--shared_memory_size_mb`): that node's share of the KV cache "
        "pool. `container.shmSize` must hold it, and with `hugeTlb` so must `hugepages.gib`."))
    node_timeout_s: Seconds(ge=1) = Field(30, description=(
        "Seconds a worker may stay silent before the pool considers it lost (`--node_timeout_s`)."))
    node_dead_timeout_s: Seconds(ge=1) = Field(60, description=(
        "Seconds of silence after which etcd declares a worker dead (`--node_dead_timeout_s`); must exceed "
        "`nodeTimeoutS` (the seeds use twice as long)."))
    liveness_path: OwnedFile = Field("/workspace/liveness", description=(
        "File the worker rewrites about every 100 ms with `liveness check success` (`--liveness_check_path`); the "
        "start script and the liveness probe read it."))
    huge_tlb: bool = Field(False, description="Back the worker's shared memory with huge pages "
                                              "(`--enable_huge_tlb`); needs `hugepages.gib` at least the shared "
                                              "memory. The seeds turn it on above about 21 GB of shared memory.")
    arena_per_tenant: Optional[int] = Field(None, ge=1, le=1024, description=(
        "Shared-memory arenas per tenant (`--arena_per_tenant`): more arenas speed up first allocations, each costs "
        "a file descriptor; unset: the worker's default (16)."))
    rh2d_device_ids: list[int] = Field(
        default_factory=list, alias="rh2dDeviceIds", description=(
        "NPU ids for remote host-to-device transfers (`--remote_h2d_device_ids`); non-empty enables RH2D and sets "
        "`DS_ENABLE_REMOTE_H2D=1` on every rank.")
    )
    interleave: Optional[Interleave] = Field(None, description=(
        "Start the worker under `numactl --interleave` on these NUMA nodes (e.g. `0-7`), spreading its shared memory "
        "over them; unset: no numactl."))
    start_timeout_s: Seconds(ge=10) = Field(600, description=(
        "Seconds `dscli start -t` waits for the worker to become ready; dscli kills it after that."))
    start_attempts: int = Field(
        3, ge=1, le=10,
        description="How many times `dscli start` runs when the worker is killed while starting (right after a "
                    "restart its etcd thread can SIGKILL its own process while rejoining the pool); any other start "
                    "failure fails at once.",
    )
    stop_timeout_s: Seconds(ge=5) = Field(
        120, description="Seconds `dscli stop` may take on delete before the worker is killed (dscli's own bound "
                         "grows with the shared memory to hours)."
    )
    flags: dict[WorkerFlagKey, Union[Text, int, bool]] = Field(
        default_factory=dict, description="Extra worker flags (name without `--` → value), for what ascend-pd has no "
                                          "setting for; derived ones are refused (see below)."
    )


class Etcd(_Model):
    """The single etcd member the workers register in."""

    node: Name = Field(description="Node that runs the single etcd member (inside its NPU container, or in a "
                                   "container of its own with `image`).")
    client_port: Port() = Field(2379, description="etcd client port on the etcd node; the workers register and "
                                                  "`status` reads through it.")
    peer_port: Port() = Field(2380, description="etcd peer port on the etcd node (a single member: only etcd itself "
                                                "uses it).")
    data_dir: OwnedPath = Field("/tmp/etcd-data", description=(
        "etcd's data directory: emptied on every fresh start and removed on destroy, so the workers always register "
        "in a clean etcd."))
    binary: Command = Field("etcd", description="etcd executable inside the NPU container (binary mode) or inside "
                                                "the etcd image (image mode).")
    version: EtcdVersion = Field(
        "v3.5.12", description="Release installed from github.com/etcd-io when `binary` is missing from the "
                               "container (binary mode only)."
    )
    image: Optional[ImageRef] = Field(
        None,
        description="Run etcd in its own container from this image (e.g. quay.io/coreos/etcd:v3.5.12) on the "
        "etcd node instead of as a binary in the node's NPU container; its data lives and dies with that container.",
    )
    container_name: DockerName = Field("ascend-pd-etcd", description=(
        "Name of etcd's own container on the etcd node (image mode only: set `image`)."))
    start_timeout_s: Seconds(ge=5) = Field(60, description=(
        "Seconds to wait for etcd's `/health` before the etcd step fails."))


class ProxyFlags(_Model):
    """The four tunable flags of the PD proxy script (everything else is derived)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=False)
    max_retries: Optional[int] = Field(None, alias="max-retries", ge=0, le=100, description=(
        "Attempts of each request to a prefill or decode rank before the proxy gives up (`--max-retries`); unset: "
        "the script's default, 3."))
    retry_delay: Optional[float] = Field(None, alias="retry-delay", ge=0, le=3600, description=(
        "Base delay in seconds of the exponential backoff between those attempts (`--retry-delay`); unset: the "
        "script's default, 0.001."))
    max_waiting_retries: Optional[int] = Field(None, alias="max-waiting-retries", ge=0, le=100,
                                               description=(
        "Checks of an instance added through `/instances/add` before the proxy gives up on it "
        "(`--max-waiting-retries`); unset: the script's default, 3."))
    waiting_retry_interval: Optional[float] = Field(1.0, alias="waiting-retry-interval", ge=0.1, le=3600,
                                                    description=(
        "Seconds between those checks (`--waiting-retry-interval`; the script's own default is 10). The proxy "
        "drops an instance given to `/instances/remove` only at one of these checks, and only if no request is in "
        "flight at that moment: at 10 s the drain of a role's only instance under load almost never finishes."))


class Proxy(_Model):
    """The vLLM-Ascend PD proxy."""

    node: Name = Field(description="Node that runs the PD proxy; it binds that node's address.")
    port: Port() = Field(description="Port the proxy listens on: clients send `/v1/completions` and "
                                     "`/v1/chat/completions` to the proxy node's address at this port.")
    script: FilePath = Field(
        "/vllm-workspace/vllm-ascend/examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py",
        description="The PD proxy script inside the container: vLLM-Ascend's example load-balancing proxy.",
    )
    python: Command = Field("python3", description="Python interpreter inside the container that runs the proxy "
                                                   "script.")
    flags: ProxyFlags = Field(default_factory=ProxyFlags, description=(
        "The proxy script's four tunable flags; everything else it takes is derived from the plan."))
    auth: bool = Field(True, description=(
        "Client routes (`/v1/...`) answer only requests carrying `Authorization: Bearer <key>`, the key being the "
        "secret `ascend-pd:proxyApiKey` (`pulumi config set --secret ascend-pd:proxyApiKey \"$(openssl rand -hex "
        "32)\"`); the routes that change the proxy (`/instances/...`, `/reset_prefix_cache`) answer the cluster's "
        "nodes only, key or not; `/healthcheck` answers both. `status`, `heal` and the exporter send the key from "
        "`$ASCEND_PD_PROXY_API_KEY`. The release's script runs unchanged behind `pd_proxy_launch.py`. `false`: the "
        "proxy answers anyone, as shipped."))
    keep_removed_out: bool = Field(True, description=(
        "Run the release's proxy script, unedited, through `pd_proxy_launch.py`, which fixes two things a "
        "rolling restart meets: an instance given to `/instances/remove` stays out until `/instances/add` (as "
        "shipped, it gets its priority back whenever one of its earlier requests ends, so under steady load it "
        "keeps receiving requests and some fail when it stops), and while a role has no instance in service "
        "requests are refused at once with 503 and `Retry-After` (as shipped, they go to the stopping instance "
        "and come back as empty 200s). `false`: the script runs exactly as shipped."))
    ready_timeout_s: Seconds(ge=10) = Field(300, description=(
        "Seconds to wait for the proxy's `/healthcheck` to count every prefill and decode instance."))
    smoke_timeout_s: Seconds(ge=10) = Field(600, description=(
        "Seconds the chat completion through the proxy may take once it is up (also the timeout of the `smokeTest` "
        "output's curl)."))


class Rollout(_Model):
    """How a launch restarts the ranks of an instance that is serving (changed flags, a heal)."""

    max_unavailable: CountOrPercent = Field("25%", description=(
        "Instances of one role that may restart at once, as a count or a percentage of the role's instances "
        "(Kubernetes' semantics: rounded down, at least 1; the default is 1 for up to 7 instances and 32 "
        "of 128, so a large role rolls in 4 waves, not 128); the others keep serving. A role with this many "
        "instances or fewer has an outage while it restarts (requests are refused fast by the proxy)."))
    drain_timeout_s: Seconds(ge=1) = Field(300, description=(
        "How long a restart waits, once the instance is out of the proxy, for its ranks' running and waiting "
        "requests to finish; after it the ranks are stopped anyway (the requests still on them fail)."))


class Firewall(_Model):
    """The host firewall every node gets from the plan: nftables, a table of ascend-pd's own."""

    enabled: bool = Field(True, description=(
        "Load the table on every node before anything of the serving path starts: the cluster's nodes reach "
        "each other on every port; `operators` reach what `status`, the exporter and Prometheus read; `clients` "
        "reach the proxy's port; everyone reaches SSH; anything else from outside the cluster is dropped "
        "(including the ports vLLM, torch and HCCL open at random). `false`: no table (destroy removes one "
        "loaded before)."))
    operators: list[IPv4Net] = Field(default_factory=list, description=(
        "Addresses or networks of the machines that run `ascend-pd status`, `heal`, the exporter or a site's "
        "Prometheus: they reach every rank's port, the workers, etcd's client port, the proxy, Prometheus and the "
        "node_exporter port (SSH is open to all anyway). The cluster's own nodes always do."))
    clients: list[IPv4Net] = Field(default_factory=lambda: ["0.0.0.0/0"], description=(
        "Who reaches the proxy's port (the service's clients); default: anyone. The proxy's admin routes answer "
        "the cluster's nodes only, whoever reaches the port."))
    table: Annotated[Text, Field(pattern=r"^[a-z][a-z0-9_]{0,30}$")] = Field("ascend_pd", description=(
        "Name of the `inet` table ascend-pd owns on every node; the operator's and docker's tables are untouched."))
    tcp_retries2: Optional[int] = Field(DEFAULT_TCP_RETRIES2, strict=True, ge=5, le=15, description=(
        "`net.ipv4.tcp_retries2` on every node's host, set with the table (kept in `/etc/sysctl.d`; destroy, or "
        "`null`, puts back the node's own value): how often the node retransmits to a peer that stopped "
        "acknowledging before it drops the connection. It bounds a `pulumi up` step whose node goes silent: "
        "pulumi-command puts no deadline on an SSH session, and while the node retransmits its output the "
        "session waits (the kernel's default 15: more than 15 minutes; 8: 206 s measured, docs/operations.md). "
        "`null`: the node's value is left alone."))


class Hang(_Model):
    """When a rank that answers `/health` counts as hung (`status`, the liveness probe, `heal`)."""

    seconds: Seconds(ge=1) = Field(120, description=(
        "A rank with requests running whose `vllm:generation_tokens_total` and `vllm:request_success_total` "
        "have not moved for this many seconds is hung (its `/health` may still say 200). Longer than the "
        "slowest single decode step or prefill chunk under load, or busy ranks are taken for hung."))


class Hugepages(_Model):
    """Huge pages reserved on every node's host."""

    gib: int = Field(ge=1, le=64 * 1024, description="Huge pages to reserve on every node's host, in GiB (pages = "
                                                     "GiB / the host's `Hugepagesize`); destroy restores the "
                                                     "previous count.")


class Preflight(_Model):
    """The per-node checks `doctor` runs and `pulumi up` runs first on every node."""

    mode: Literal["enforce", "warn", "off"] = Field(
        "enforce", description="What a failed check does in `pulumi up`: `enforce` stops that node's deploy before "
                               "its image, container or huge pages are touched; `warn` prints the failures and goes "
                               "on; `off` registers no preflight Command. `doctor` runs the checks in every mode.")
    min_cann: Optional[SoftwareVersion] = Field(None, description=(
        "Oldest CANN release accepted on the nodes; unset: the profile's (8.5.0 on both, from the seeds)."))
    min_driver: Optional[SoftwareVersion] = Field(None, description=(
        "Oldest NPU driver (HDK) release accepted; unset: the profile's (A2 25.2.3, or 25.5.0 with "
        "`yuanrong.rh2dDeviceIds`; A3 25.5.0)."))
    max_clock_skew_ms: int = Field(500, ge=1, le=3_600_000, description=(
        "Largest clock difference between two nodes, in ms, that `doctor` accepts; above half of it is a warning."))
    min_host_memory_gib: Optional[int] = Field(None, ge=0, le=1024 * 1024, description=(
        "Host RAM (`MemTotal`, GiB) below which the memory check warns: the size the guides were written for. "
        "Unset: the profile's (A3 960, for seed 003's 1 T of RAM as `MemTotal` reads it; A2 none, seed 000 names "
        "no figure); 0: no such warning. What the stack itself needs (huge pages, the worker's shared memory) "
        "is checked against `MemAvailable` either way, and fails."))
    min_free_disk_gib: int = Field(50, ge=0, le=1024 * 1024, description=(
        "Free space in GiB the docker root (`/var/lib/docker`) must have: an image not yet on the node is 15-30 "
        "GB, the logs grow beside it."))


# The Prometheus settings (monitoring.py generates the files from them and the plan; it sits above plan).


def _seconds(ge: int, le: int):
    """valuetypes.Seconds with an upper bound of its own (a bound given in the assigned Field would lose to
    the Annotated one)."""
    return Annotated[int, Field(strict=True, ge=ge, le=le), SECONDS]


class Monitoring(Settings):
    """The Prometheus configuration `render --out` writes for the stack (scrape targets, rules, alerts)."""

    @model_validator(mode="after")
    def _windows_hold_scrapes(self) -> "Monitoring":
        if self.rate_window_s < 4 * self.scrape_interval_s:
            raise ValueError(
                f"monitoring.rateWindowS {self.rate_window_s} holds fewer than four scrapes of "
                f"monitoring.scrapeIntervalS {self.scrape_interval_s}: a rate needs two samples even when one scrape "
                f"fails; set rateWindowS to at least {4 * self.scrape_interval_s}")
        if self.baseline_window_s < 2 * self.rate_window_s:
            raise ValueError(
                f"monitoring.baselineWindowS {self.baseline_window_s} is shorter than twice monitoring.rateWindowS "
                f"{self.rate_window_s}: the hit-rate drop alert compares the last rateWindowS with a baseline that "
                f"window would dominate; set baselineWindowS to at least {2 * self.rate_window_s}")
        return self

    scrape_interval_s: _seconds(1, 15) = Field(5, description=(
        "How often Prometheus reads every rank's and etcd's `/metrics`, and evaluates the rules, in seconds."))
    rate_window_s: _seconds(4, 3600) = Field(300, description=(
        "Window of the recorded rates, hit ratios over time and latency quantiles, and of the decode-only "
        "fallback and request error alerts, in seconds (at least four scrapes: `4 × scrapeIntervalS`)."))
    baseline_window_s: _seconds(600, 86400) = Field(3600, description=(
        "Window of the KV pool hit rate's own baseline that the hit-rate drop alert compares the last "
        "`rateWindowS` with, in seconds."))
    hit_rate_drop_percent: int = Field(30, ge=1, le=100, description=(
        "The KV pool hit-rate drop alert fires when the openYuanrong pool's hit rate (prefill ranks' external "
        "hits / external queries) over `rateWindowS` is this many percent below its own average over "
        "`baselineWindowS`, relative to it (30: a baseline of 80 % alerts below 56 %)."))
    min_baseline_percent: int = Field(5, ge=0, le=100, description=(
        "The hit-rate drop alert applies only while the pool's baseline hit rate is at least this many percent "
        "(a drop from a tiny baseline is noise)."))
    node_exporter_port: Optional[Port(ge=1, le=65535)] = Field(9100, description=(
        "Port of the site's Prometheus node_exporter on every node, scraped for the huge pages alert (`null`: not "
        "scraped, and no huge pages alert). A node_exporter that does not answer raises a warning of its own."))
    exporter: Optional[HostPort] = Field(None, description=(
        "`host:port` where `ascend-pd exporter` serves the cluster facts that no component exports (worker "
        "registrations in etcd, rollout slots, the P/D smoke completion through the proxy); unset: not scraped, "
        "and the alerts on them are not generated."))
    smoke_interval_s: _seconds(5, 3600) = Field(30, description=(
        "How often `ascend-pd exporter` sends its one-token P/D smoke completion through the proxy, in seconds."))
    node: Optional[Name] = Field(None, description=(
        "Node on which `pulumi up` runs Prometheus (in a container of its own, host network) with the generated "
        "configuration and rules, after the proxy; unset: nothing is deployed (a site's own Prometheus takes the "
        "files `render --out` writes)."))
    image: ImageRef = Field("quay.io/prometheus/prometheus:v2.53.4", description=(
        "Prometheus image run on `monitoring.node` (a registry mirror the nodes can pull from, as for "
        "`container.image`)."))
    port: Port() = Field(9090, description="Port of Prometheus' web UI and API on `monitoring.node`.")
    dir: OwnedPath = Field("/var/lib/ascend-pd/prometheus", description=(
        "Directory on `monitoring.node`'s host holding the generated configuration (`config/`) and the TSDB "
        "(`data/`); destroy removes the configuration and keeps the data."))
    container_name: DockerName = Field("ascend-pd-prometheus", description=(
        "Name of the Prometheus container on `monitoring.node`."))
    retention_days: int = Field(15, ge=1, le=3650, description=(
        "Days of samples Prometheus on `monitoring.node` keeps (`--storage.tsdb.retention.time`)."))
    decode_self_prefill_percent: int = Field(25, ge=1, le=100, description=(
        "The decode-only fallback alert fires for a decode rank that computed more than this many percent of its "
        "requests' prompt tokens itself over `rateWindowS` (neither received from prefill nor in its own prefix "
        "cache), or served requests while receiving no KV at all. A healthy decode computes at most each prompt's "
        "last token."))
    error_percent: int = Field(5, ge=1, le=100, description=(
        "The request error alert fires for an instance when more than this many percent of the requests it "
        "finished over `rateWindowS` ended in `error` (client aborts do not count)."))
    alert_for_s: _seconds(0, 3600) = Field(120, description=(
        "How long a condition must hold before its alert fires (rank or etcd down, no etcd leader, decode-only "
        "fallback, hit-rate drop), in seconds; a hang waits `hang.seconds` instead."))


class StackConfig(_Model):
    """Everything under the `ascend-pd:` namespace of a stack file."""

    hardware: Literal["atlas-800i-a2", "atlas-800-a3"] = Field(
        description="Server model of every node: `atlas-800i-a2` (Atlas 800I A2, 8 NPUs per node) or `atlas-800-a3` "
                    "(Atlas 800 A3, 16 NPU dies per node). The NPU count bounds local DP ranks × TP and fixes "
                    "Mooncake's AscendDirect port range.")
    ssh: Ssh = Field(default_factory=Ssh, description="How Pulumi reaches every node over SSH: pulumi-command runs "
                                                      "the scripts, pulumi-docker drives the docker daemons.")
    nodes: list[Node] = Field(min_length=1, description="The servers, one entry each. Every node gets the NPU "
                                                        "container and an openYuanrong worker; `prefill.nodes` and "
                                                        "`decode.nodes` give each node at most one role.")
    container: Container = Field(description="The long-lived NPU container on every node (the seeds' "
                                             "`start-docker.sh`), inside which every service runs.")
    model: Model = Field(description="The model weights every rank loads and the name clients ask for.")
    vllm: Vllm = Field(default_factory=Vllm, description=(
        "vLLM settings shared by both roles; each role's own `flags` and `env` override them."))
    vllm_ascend: VllmAscend = Field(default_factory=VllmAscend, description=(
        "The vllm-ascend release the images run, and how strictly the stack is held to it "
        "(docs/reference.md, \"Release checks\")."))
    prefill: Role = Field(description="The prefill role: DP instances that compute the prompts' KV cache and send it "
                                      "to decode through Mooncake (`kv_producer`).")
    decode: Role = Field(description="The decode role: DP instances that receive the KV cache from prefill through "
                                     "Mooncake and generate the tokens (`kv_consumer`).")
    yuanrong: Yuanrong = Field(description="The openYuanrong Datasystem worker on every node: the external KV cache "
                                           "pool the ranks share (AscendStoreConnector).")
    etcd: Etcd = Field(description="The single etcd member the openYuanrong workers register in (under "
                                   "`/datasystem/cluster/`).")
    proxy: Proxy = Field(description="The vLLM-Ascend PD proxy in front of every rank: the endpoint clients send "
                                     "their requests to.")
    rollout: Rollout = Field(default_factory=Rollout, description=(
        "Restarting serving instances: out of the proxy, drained, restarted, checked, back in; at most "
        "`maxUnavailable` instances of a role at a time."))
    firewall: Firewall = Field(default_factory=Firewall, description=(
        "The host firewall of every node, generated from the plan (nftables; docs/deploying.md, \"Security\")."))
    hang: Hang = Field(default_factory=Hang, description=(
        "Hang detection: how long a busy rank's token and success counters may stay flat."))
    monitoring: Monitoring = Field(default_factory=Monitoring, description=(
        "Prometheus for the stack, written by `render --out` under `<out>/monitoring`: scrape targets, recording "
        "rules, alerts (docs/operations.md)."))
    hugepages: Optional[Hugepages] = Field(None, description=(
        "Huge pages reserved on every node's host before its worker starts; unset: none are reserved (no "
        "`HugepageHost`). `yuanrong.hugeTlb` needs them."))
    preflight: Preflight = Field(default_factory=Preflight, description=(
        "The preflight checks (versions, pages, memory, clocks, NPUs, RoCE fabric, ports, weights, docker, "
        "network, firewall): `python -m ascend_pd doctor` runs them, and `pulumi up` runs a node's before anything else on "
        "it."))
    state_dir: OwnedPath = Field(DEFAULT_STATE_DIR, description=(
        "Directory inside every container for ascend-pd's pid files, logs (`logs/`), probes and working dirs. "
        "Changing it replaces every service (the old deletes run first); keep it short, the worker's unix socket "
        "paths live under it."))
    converge: int = Field(
        0, ge=0, le=2**53,
        description="Change it (e.g. to the date) to make the next `pulumi up` run every service script again: "
        "after a reboot, a docker restart or a dead rank the idempotent scripts restart only what is dead.",
    )

    @property
    def npus(self) -> int:
        return HARDWARE_NPUS[self.hardware]

    @property
    def min_cann(self) -> str:
        return self.preflight.min_cann or MIN_CANN[self.hardware]

    @property
    def min_host_memory_gib(self) -> int:
        if self.preflight.min_host_memory_gib is not None:
            return self.preflight.min_host_memory_gib
        return MIN_HOST_MEMORY_GIB[self.hardware]

    @property
    def min_driver(self) -> str:
        if self.preflight.min_driver:
            return self.preflight.min_driver
        if self.yuanrong.rh2d_device_ids and self.hardware == "atlas-800i-a2":
            return MIN_DRIVER_RH2D
        return MIN_DRIVER[self.hardware]


def node_image(cfg: StackConfig, roles: Sequence[str]) -> str:
    """The image of a node's NPU container: that of the role it serves (a node serves at most one),
    else container.image (a node with only etcd or the proxy)."""
    return next((getattr(cfg, r).image for r in ("prefill", "decode") if r in roles and getattr(cfg, r).image),
                cfg.container.image)


def step_name(step: Union[PipStep, PatchStep]) -> str:
    """A preparation step's identity by content (not position), so inserting a step renames
    nothing: `pip-transformers`, `patches-vllm-ascend`."""
    if isinstance(step, PipStep):
        first = next((a for a in step.pip if not a.startswith("-")), step.pip[0])
        base = first.rsplit("/", 1)[-1]
        # A wheel or sdist file name starts with the distribution name, then "-<version>".
        word = base.split("-")[0] if base.endswith((".whl", ".tar.gz", ".zip")) else re.split(r"[=<>!~\[ @;]", base)[0]
        return "pip-" + re.sub(r"[^a-z0-9-]+", "-", word.lower()).strip("-")
    return "patches-" + re.sub(r"[^a-z0-9-]+", "-", step.repo.rstrip("/").rsplit("/", 1)[-1].lower()).strip("-")


def docker_size_mib(size: str) -> int:
    """docker's --shm-size text (`800g`, `512000m`, `65536k`, bare bytes) in MiB, rounded up so a
    container never gets less than written."""
    text = size.strip().lower()
    per_unit = {"k": 1 / 1024, "m": 1, "g": 1024}
    unit = text[-1] if text[-1:] in per_unit else ""
    number = int(text[:-1] if unit else text)
    mib = number * per_unit[unit] if unit else number / (1024 * 1024)
    return int(mib) if mib == int(mib) else int(mib) + 1


# Keys of the namespace that are not StackConfig fields: secrets read separately by __main__.
SECRET_KEYS = ("sshPrivateKey", "proxyApiKey")


def setting_names() -> list[str]:
    """The top-level keys a stack file may set (camelCase, without the namespace)."""
    return [f.alias or n for n, f in StackConfig.model_fields.items()]
