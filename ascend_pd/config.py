"""What operators write: the `ascend-pd:*` keys of a `Pulumi.<stack>.yaml`, as strict pydantic models.

Keys are camelCase in the stack file (Pulumi's convention); every model forbids unknown keys so a
typo is an error instead of a silently ignored setting. Defaults live here, as named constants with
the reason beside them, so the stack files hold only what differs per cluster.

Nothing here imports pulumi: the same models load a stack file for `render` and `status`.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator
from pydantic.alias_generators import to_camel

PROJECT = "ascend-pd"

# NPUs per server of each supported hardware profile (Atlas 800I A2: 8 x 64 GB; Atlas 800 A3: 16 dies).
HARDWARE_NPUS = {"atlas-800i-a2": 8, "atlas-800-a3": 16}

# Where everything ascend-pd starts inside a container keeps its pid files, logs and working dirs.
# /workspace is container-local (not a host mount), so replacing the container starts clean.
DEFAULT_STATE_DIR = "/workspace/ascend-pd"

# The seeds' start-docker.sh mounts, minus /tmp-style scratch the program does not rely on being shared.
DEFAULT_MOUNTS = (
    ("/usr/local/Ascend/driver", "/usr/local/Ascend/driver"),
    ("/usr/local/dcmi", "/usr/local/dcmi"),
    ("/usr/local/bin/npu-smi", "/usr/local/bin/npu-smi"),
    ("/etc/ascend_install.info", "/etc/ascend_install.info"),
    ("/usr/local/sbin", "/usr/local/sbin"),
    ("/etc/hccn.conf", "/etc/hccn.conf"),
    ("/home", "/home"),
    ("/mnt", "/mnt"),
    ("/tmp", "/tmp"),
    ("/data", "/data"),
    ("/usr/share/zoneinfo/Asia/Shanghai", "/etc/localtime"),
)
# The seeds work in an interactive `docker exec -it <container> bash`, whose ~/.bashrc and
# /etc/profile source CANN's environment scripts; the non-interactive shell ascend-pd runs reads
# neither, so container scripts source them explicitly (skipping absent ones).
DEFAULT_ENV_FILES = (
    "/usr/local/Ascend/ascend-toolkit/set_env.sh",
    "/usr/local/Ascend/nnal/atb/set_env.sh",
)
DEFAULT_DEVICES = ("/dev/davinci_manager", "/dev/hisi_hdc", "/dev/devmm_svm")

Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")]
FlagValue = Union[bool, int, float, str, dict, list, None]
EnvValue = Union[str, int, float, bool]


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=False
    )


class Node(_Model):
    """One server."""

    name: Name = Field(description="Logical node name; resource names and URNs derive from it.")
    address: str = Field(description="Business-network IPv4 address the services bind and SSH reaches.")
    nic: str = Field(description="Business NIC name (HCCL/GLOO/TP_SOCKET_IFNAME), e.g. enp67s0f0np0.")

    @field_validator("address")
    @classmethod
    def _ipv4(cls, v: str) -> str:
        parts = v.split(".")
        if len(parts) != 4 or not all(p.isdigit() and 0 <= int(p) <= 255 for p in parts):
            raise ValueError(f"{v!r} is not an IPv4 address like 192.0.2.10")
        return v


class Ssh(_Model):
    """How Pulumi reaches every node. The private key, if any, is the secret `ascend-pd:sshPrivateKey`."""

    user: str = Field("root", description="SSH user; needs docker and /proc/sys/vm write access.")
    port: int = Field(22, ge=1, le=65535)
    host_keys: dict[str, str] = Field(
        default_factory=dict,
        description="Optional pinned host public keys by node name ('ssh-ed25519 AAAA...').",
    )


class Mount(_Model):
    host: str
    container: str
    read_only: bool = False


class PipStep(_Model):
    """`pip install <args>` inside the container (the A3 guide's transformers upgrade)."""

    pip: list[str] = Field(min_length=1, description="Arguments to pip install, one per item.")


class PatchStep(_Model):
    """`git am` a list of patch files (paths inside the container) onto a repository."""

    repo: str = Field(description="Repository inside the container, e.g. /vllm-workspace/vllm-ascend.")
    patches: list[str] = Field(min_length=1)


class Container(_Model):
    """The long-lived NPU container on every node (the seeds' start-docker.sh)."""

    name: str = Field(description="Fixed container name on every node.")
    image: str = Field(description="vLLM-Ascend image, e.g. quay.io/ascend/vllm-ascend:v0.20.2rc1.")
    shm_size: str = Field(description="docker --shm-size, e.g. 800g; must hold the worker's shared memory.")
    extra_mounts: list[Mount] = Field(default_factory=list, description="Mounts beyond the seeds' set.")
    env: dict[str, str] = Field(default_factory=dict, description="Container environment (e.g. proxies).")
    prepare: list[Union[PipStep, PatchStep]] = Field(
        default_factory=list, description="Steps run once in every container after it is created."
    )
    env_files: list[str] = Field(
        default_factory=lambda: list(DEFAULT_ENV_FILES),
        description="Sourced (if present) before anything Python or NPU-related starts in the container.",
    )

    @field_validator("shm_size")
    @classmethod
    def _size(cls, v: str) -> str:
        if not re.fullmatch(r"\d+[kmg]?", v.strip().lower()):
            raise ValueError(f"{v!r} is not a docker size like 800g or 512000m")
        return v.strip().lower()


class Model(_Model):
    path: str = Field(description="Model weights directory inside the container.")
    served_name: str = Field(description="--served-model-name; also what clients put in `model`.")


class Vllm(_Model):
    """Settings shared by both roles."""

    flags: dict[str, FlagValue] = Field(
        default_factory=dict, description="vLLM flag (without --) -> value, for both roles."
    )
    env: dict[str, EnvValue] = Field(default_factory=dict, description="Environment for both roles.")
    ready_timeout_s: int = Field(
        3600, ge=60, description="Deadline for every rank of a node to answer /health."
    )
    stop_timeout_s: int = Field(60, ge=5, description="TERM -> KILL grace when stopping ranks.")


class Role(_Model):
    """Prefill or decode: `instances` DP groups of `dp` ranks with TP `tp` each."""

    nodes: list[str] = Field(min_length=1, description="Node names of this role, in instance order.")
    nodes_per_instance: int = Field(1, ge=1, description="Nodes one DP instance spans.")
    dp: int = Field(ge=1, description="Data-parallel size of ONE instance.")
    tp: int = Field(ge=1, description="Tensor-parallel size of every rank.")
    port_base: int = Field(ge=1024, le=65535, description="Local rank i listens on port_base + i.")
    rpc_port: int = Field(ge=1024, le=65535, description="--data-parallel-rpc-port.")
    kv_port: int = Field(ge=1024, le=65535, description="Mooncake connector kv_port.")
    connector: str = Field(
        "MooncakeConnectorV1", description="Mooncake connector class inside the MultiConnector."
    )
    connector_module_path: Optional[str] = Field(
        None, description="kv_connector_module_path of the Mooncake child, if the guide sets it."
    )
    flags: dict[str, FlagValue] = Field(default_factory=dict, description="Role flags; null drops a common one.")
    env: dict[str, EnvValue] = Field(default_factory=dict, description="Role environment.")


class Yuanrong(_Model):
    """openYuanrong Datasystem worker on every node (dscli start)."""

    package: str = Field(
        "openyuanrong-datasystem", description="pip requirement or wheel URL installed in each container."
    )
    port: int = Field(18481, ge=1024, le=65535, description="Worker port (DS_WORKER_ADDR).")
    shared_memory_mb: int = Field(ge=64, description="--shared_memory_size_mb.")
    node_timeout_s: int = Field(30, ge=1)
    node_dead_timeout_s: int = Field(60, ge=1, description="Must exceed nodeTimeoutS.")
    liveness_path: str = Field("/workspace/liveness", description="File the worker rewrites every ~100 ms.")
    huge_tlb: bool = Field(False, description="--enable_huge_tlb; needs huge pages >= shared memory.")
    arena_per_tenant: Optional[int] = Field(None, ge=1)
    rh2d_device_ids: list[int] = Field(
        default_factory=list, alias="rh2dDeviceIds", description="--remote_h2d_device_ids; non-empty enables RH2D (client too)."
    )
    interleave: Optional[str] = Field(None, description="numactl --interleave nodes, e.g. 0-7.")
    start_timeout_s: int = Field(600, ge=10, description="dscli start -t.")
    start_attempts: int = Field(
        3, ge=1, le=10,
        description="dscli starts before giving up when the worker is killed while starting (right after a "
        "restart its etcd thread can SIGKILL its own process while rejoining the pool); other start failures "
        "fail at once.",
    )
    stop_timeout_s: int = Field(
        120, ge=5, description="Bound on dscli stop before the worker is killed (dscli's own can be hours)."
    )
    flags: dict[str, Union[str, int, bool]] = Field(
        default_factory=dict, description="Extra worker flags (without --)."
    )


class Etcd(_Model):
    node: str = Field(description="Node that runs the single etcd member (inside its container).")
    client_port: int = Field(2379, ge=1024, le=65535)
    peer_port: int = Field(2380, ge=1024, le=65535)
    data_dir: str = Field("/tmp/etcd-data", description="Removed on destroy (stale data breaks restarts).")
    binary: str = Field("etcd", description="etcd executable inside the container (or the image).")
    version: str = Field(
        "v3.5.12", description="Release installed from github.com/etcd-io if `binary` is missing (binary mode only)."
    )
    image: Optional[str] = Field(
        None,
        description="Run etcd in its own container from this image (e.g. quay.io/coreos/etcd:v3.5.12) on the "
        "etcd node instead of as a binary in the node's NPU container; its data lives and dies with that container.",
    )
    container_name: str = Field("ascend-pd-etcd", description="Name of the etcd container (image mode).")
    start_timeout_s: int = Field(60, ge=5)


class Proxy(_Model):
    node: str = Field(description="Node that runs the PD proxy (it binds that node's address).")
    port: int = Field(ge=1024, le=65535)
    script: str = Field(
        "/vllm-workspace/vllm-ascend/examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py",
        description="Proxy script inside the container.",
    )
    python: str = Field("python3", description="Interpreter inside the container.")
    flags: dict[str, Union[int, float]] = Field(
        default_factory=dict,
        description="max-retries, retry-delay, max-waiting-retries, waiting-retry-interval.",
    )
    ready_timeout_s: int = Field(300, ge=10)
    smoke_timeout_s: int = Field(600, ge=10, description="Deadline of the functional chat completion.")


class Hugepages(_Model):
    gib: int = Field(ge=1, description="Huge pages wanted on every node, in GiB.")


class StackConfig(_Model):
    """Everything under the `ascend-pd:` namespace of a stack file."""

    hardware: Literal["atlas-800i-a2", "atlas-800-a3"]
    ssh: Ssh = Field(default_factory=Ssh)
    nodes: list[Node] = Field(min_length=1)
    container: Container
    model: Model
    vllm: Vllm = Field(default_factory=Vllm)
    prefill: Role
    decode: Role
    yuanrong: Yuanrong
    etcd: Etcd
    proxy: Proxy
    hugepages: Optional[Hugepages] = None
    state_dir: str = Field(DEFAULT_STATE_DIR, description="pid files, logs and working dirs in containers.")

    @property
    def npus(self) -> int:
        return HARDWARE_NPUS[self.hardware]


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
SECRET_KEYS = ("sshPrivateKey",)


def setting_names() -> list[str]:
    """The top-level keys a stack file may set (camelCase, without the namespace)."""
    return [f.alias or n for n, f in StackConfig.model_fields.items()]
