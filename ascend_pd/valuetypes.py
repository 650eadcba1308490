"""The kinds of value a stack file may hold, as constrained pydantic types.

Every string of a stack file ends up in a shell script that runs as root on every node. The
scripts quote every value (ascend_pd.shell), and these types refuse what can never be legitimate:
control characters, the reserved heredoc prefix, empty names and paths, relative paths, system
and host-mount roots where a path is written or deleted, malformed addresses, names, keys.
Each refusal says what is wrong; the loader adds the setting's name and a fix.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
import unicodedata
from dataclasses import dataclass
from typing import Annotated, Any, Optional

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel


@dataclass(frozen=True)
class Kind:
    """What a kind of value is called for operators, in the README's settings table: `name` in the
    type column ("port", "IPv4 address"), `accepts` in the value-type legend. `ge`/`le` are the
    kind's usual bounds; the table shows a field's own bounds only where they differ.

    Pydantic ignores this metadata; ascend_pd.docs reads the last Kind of an Annotated type, so a
    type built on another (Word on Text) names itself by adding its own Kind after the base's."""

    name: str
    accepts: str
    plural: str = ""
    ge: Optional[int] = None
    le: Optional[int] = None

    @property
    def names(self) -> str:
        return self.plural or self.name + "s"


RESERVED_PREFIX = "ASCEND_PD_"  # ascend_pd.shell's heredoc delimiters all start with it
BASH_SECONDS_MAX = 7 * 24 * 3600  # a week: far above any real wait, far below bash's 2**63


def unsafe_reason(text: str) -> str | None:
    """Why `text` cannot be in a stack file at all, or None."""
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp"):
            return f"contains the control character U+{ord(ch):04X} (newlines, tabs and escapes are not allowed)"
    if RESERVED_PREFIX in text:
        return f"contains {RESERVED_PREFIX}, which ascend-pd reserves for the delimiters of its scripts"
    return None


def _safe(v: str) -> str:
    why = unsafe_reason(v)
    if why:
        raise ValueError(why)
    return v


def _pattern(regex: str, example: str):
    compiled = re.compile(regex)

    def check(v: str) -> str:
        if not compiled.fullmatch(v):
            raise ValueError(f"{v!r} is not valid here; expected something like {example}")
        return v
    return AfterValidator(check)


Text = Annotated[str, StringConstraints(strict=True, min_length=1), AfterValidator(_safe),
                 Kind("string", "any non-empty text on one line (no control characters)")]
"""Any non-empty single-line text (it is quoted wherever it goes)."""

Name = Annotated[str, StringConstraints(strict=True), _pattern(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?", "'p0' or 'decode-a'"),
                 Kind("node name", "lower-case letters, digits and inner dashes, at most 32 characters, e.g. `p0`")]
"""Logical names (nodes): resource names and URNs derive from them."""

Word = Annotated[Text, _pattern(r"[^\s]+", "a value without spaces"),
                 Kind("word", "text without spaces")]
"""A single word without whitespace (pip requirements, URLs, model names)."""

Command = Annotated[Text, _pattern(r"[A-Za-z0-9_./+][A-Za-z0-9_./+-]*(?<!/)", "'python3' or '/usr/bin/python3'"),
                    Kind("command", "an executable: a name looked up on `PATH` or an absolute path, e.g. `python3`")]
"""An executable: a name looked up on PATH, or a path (of a file: no trailing /)."""

DockerName = Annotated[Text, _pattern(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", "'ds_v4_flash_yr'"),
                       Kind("container name", "letters, digits, `_ . -`, at most 128 characters")]
ImageRef = Annotated[Text, _pattern(
    r"[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?",
    "'quay.io/ascend/vllm-ascend:v0.20.2rc1'"),
    Kind("image", "a docker image reference with a tag and/or an `@sha256:` digest, "
         "e.g. `quay.io/ascend/vllm-ascend:v0.20.2rc1`")]
HOST = r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?"  # a host name or IPv4 address (HostPort, exporter --listen)
HostPort = Annotated[Text, _pattern(HOST + r":([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])",
                                "'10.0.0.9:9478' or 'mon-host:9478'"),
                     Kind("address", "host:port (a host name or IPv4 address, a port 1-65535)")]
Nic = Annotated[Text, _pattern(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}", "'enp67s0f0np0' (at most 15 characters)"),
                Kind("NIC name", "a network interface name, at most 15 characters, e.g. `enp67s0f0np0`")]
SshUser = Annotated[Text, _pattern(r"[a-z_][a-z0-9_-]{0,31}", "'root' or 'deploy'"),
                    Kind("user name", "a Unix user name, e.g. `root`")]
EnvName = Annotated[Text, _pattern(r"[A-Za-z_][A-Za-z0-9_]*", "'HCCL_BUFFSIZE'"),
                    Kind("env var name", "`[A-Za-z_][A-Za-z0-9_]*`, e.g. `HCCL_BUFFSIZE`")]
PythonIdentifier = Annotated[Text, _pattern(r"[A-Za-z_][A-Za-z0-9_]*", "'MooncakeConnectorV1'"),
                             Kind("Python name", "a Python identifier, e.g. `MooncakeConnectorV1`")]
PythonModule = Annotated[Text, _pattern(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*",
                                        "'vllm_ascend.distributed.mooncake_connector'"),
                         Kind("Python module", "a dotted module path, e.g. `vllm_ascend.distributed.mooncake_connector`")]
Interleave = Annotated[Text, _pattern(r"all|[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*", "'0-7' or 'all'"),
                       Kind("NUMA nodes", "`all` or a numactl node list, e.g. `0-7` or `0,2-3`",
                            plural="NUMA node lists")]
# CANN and driver (HDK) releases: `8.5.0`, `25.2.3`, and the RC spellings `8.0.RC2`, `23.0.rc3`.
SoftwareVersion = Annotated[Text, _pattern(r"[0-9]+(\.[0-9]+|\.[Rr][Cc][0-9]+){1,3}", "'8.5.0' or '8.0.RC2'"),
                            Kind("version", "dotted release numbers, e.g. `8.5.0` or `8.0.RC2`")]
# vllm-ascend releases as PyPI spells them: `0.18.0`, `0.20.2rc1`, `0.23.0.post1`.
ReleaseName = Annotated[Text, _pattern(r"[0-9]+\.[0-9]+\.[0-9]+(rc[0-9]+)?(\.post[0-9]+)?", "'0.23.0.post1' or '0.20.2rc1'"),
                        Kind("release", "a vllm-ascend release as PyPI names it, e.g. `0.23.0.post1` or `0.20.2rc1`")]
EtcdVersion = Annotated[Text, _pattern(r"v[0-9]+\.[0-9]+\.[0-9]+", "'v3.5.12'"),
                        Kind("etcd version", "an etcd release tag, e.g. `v3.5.12`")]
# No quotes or backslashes either: the name goes into JSON request bodies the scripts write.
ModelName = Annotated[Text, _pattern(r"[A-Za-z0-9_][^\s\"'\\`$]*", "'deepseek_v4' (no spaces, quotes or leading dash)"),
                      Kind("model name", "no spaces, quotes or backslashes and no leading dash, e.g. `deepseek_v4`")]


def _no_dashes(v: str) -> None:
    if v.startswith("-"):
        raise ValueError(f"flag names are written without leading dashes: write `{v.lstrip('-')}`")


def _vllm_flag_key(v: Any) -> Any:
    # vLLM's argument parser treats --max_num_seqs and --max-num-seqs alike: so does ascend-pd.
    if isinstance(v, str):
        _no_dashes(v)
        return v.replace("_", "-")
    return v


def _worker_flag_key(v: Any) -> Any:
    if isinstance(v, str):
        _no_dashes(v)
        return v.replace("-", "_")
    return v


FlagKey = Annotated[str, BeforeValidator(_vllm_flag_key), StringConstraints(strict=True),
                    _pattern(r"[a-z0-9][a-z0-9-]*", "'max-num-seqs' (lower case, digits and dashes, no leading dashes)"),
                    Kind("vLLM flag", "a flag name without the leading `--`, e.g. `max-num-seqs` (`_` is read as `-`)")]
WorkerFlagKey = Annotated[str, BeforeValidator(_worker_flag_key), StringConstraints(strict=True),
                          _pattern(r"[a-z0-9][a-z0-9_]*", "'arena_per_tenant'"),
                          Kind("worker flag", "a flag name without the leading `--`, e.g. `arena_per_tenant` "
                               "(`-` is read as `_`)")]


def _ipv4(v: str) -> str:
    try:
        addr = ipaddress.IPv4Address(v)  # ASCII digits only, no leading zeros
    except ValueError:
        raise ValueError(f"{v!r} is not an IPv4 address like 192.0.2.10 (ASCII digits, no leading zeros)") from None
    if addr.is_unspecified or addr.is_multicast or addr == ipaddress.IPv4Address("255.255.255.255"):
        raise ValueError(f"{v} cannot be a node's address (unspecified, multicast or broadcast)")
    return v


IPv4 = Annotated[str, StringConstraints(strict=True), AfterValidator(_ipv4),
                 Kind("IPv4 address", "dotted decimal, e.g. `192.0.2.10`; not `0.0.0.0`, multicast or broadcast",
                      plural="IPv4 addresses")]


def _ipv4_net(v: str) -> str:
    try:
        ipaddress.IPv4Network(v, strict=True)  # `10.0.0.5`, `10.0.0.0/24`; host bits set in a range are refused
    except ValueError as exc:
        raise ValueError(f"{v!r} is not an IPv4 address or network like 10.0.0.5 or 10.0.0.0/24 ({exc})") from None
    return v


IPv4Net = Annotated[str, StringConstraints(strict=True), AfterValidator(_ipv4_net),
                    Kind("IPv4 network", "an IPv4 address or CIDR network, e.g. `10.0.0.5` or `10.0.0.0/24`",
                         plural="IPv4 networks")]


def _absolute(v: str) -> str:
    if not v.startswith("/"):
        raise ValueError(f"{v!r} is not an absolute path")
    trimmed = v.rstrip("/") or "/"
    if posixpath.normpath(trimmed) != trimmed:
        raise ValueError(f"{v!r} is not a normalised path (no '.', '..' or '//')")
    return v


AbsPath = Annotated[Text, AfterValidator(_absolute),
                    Kind("absolute path", "starts with `/`, normalised (no `.`, `..` or `//`)")]


def _file(v: str) -> str:
    if v.endswith("/"):
        raise ValueError(f"{v!r} names a directory; this setting is a file: drop the trailing /")
    return v


FilePath = Annotated[AbsPath, AfterValidator(_file),
                     Kind("file path", "an absolute path of a file (no trailing `/`)")]
"""An absolute path of a file (patches, env files, scripts)."""

# Where a path that ascend-pd writes and removes (`rm -rf`) must never point: the system's own
# trees, and the container's bind mounts (whose contents live on the host).
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run",
                "/sbin", "/sys", "/usr")


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def owned_path_problem(path: str, protected: tuple[str, ...]) -> str | None:
    """Why ascend-pd may not own (write, then delete) `path`, or None. `protected` are the host
    bind-mount targets of the container: they and their parents are refused, their insides allowed."""
    p = path.rstrip("/") or "/"
    if p == "/":
        return "is the root directory"
    for tree in SYSTEM_TREES:
        if _within(p, tree):
            return f"lies in the system tree {tree}"
    for root in protected:
        if _within(root, p):
            return f"is (or contains) {root}, a directory the container mounts from the host"
    return None


OwnedPath = Annotated[AbsPath, _pattern(r"/[A-Za-z0-9._/+@-]*", "'/workspace/ascend-pd' (letters, digits, . _ - + @ /)"),
                      Kind("owned path", "an absolute path that ascend-pd writes and deletes: letters, digits and "
                           "`. _ - + @ /`; never a system tree, a host mount or the model weights")]
"""A path ascend-pd writes and deletes: conservative characters; roots are checked by the plan
against the container's mounts (owned_path_problem)."""

OwnedFile = Annotated[OwnedPath, AfterValidator(_file),
                      Kind("owned file", "an owned path of a file (no trailing `/`)")]
"""A file ascend-pd writes and deletes (the worker's liveness file)."""


def _host_key(v: str) -> str:
    kind = v.split(" ", 1)[0]
    if kind in ("ssh-rsa", "rsa-sha2-256", "rsa-sha2-512"):
        raise ValueError("is an RSA host key: pulumi-command then offers only the ssh-rsa signature, which "
                         "OpenSSH >= 8.8 refuses; pin the node's ed25519 key (ssh-keyscan -t ed25519 <node>)")
    if not re.fullmatch(r"(ssh-ed25519|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/]+={0,2}( \S.*)?", v):
        raise ValueError("is not a public host key like 'ssh-ed25519 AAAA...' (the line ssh-keyscan prints, "
                         "without the host name)")
    return v


HostKey = Annotated[Text, AfterValidator(_host_key),
                    Kind("SSH host key", "a public host key as `ssh-keyscan` prints it, without the host name, "
                         "e.g. `ssh-ed25519 AAAA...`; not RSA")]


MAX_INSTANCES = 1024
_PERCENT = re.compile(r"([1-9][0-9]?|100)%")


def _count_or_percent(v: Any) -> Any:
    if isinstance(v, int) and not isinstance(v, bool):
        if 1 <= v <= MAX_INSTANCES:
            return v
        raise ValueError(f"{v} instances: between 1 and {MAX_INSTANCES}, or a percentage of the role's instances like '25%'")
    if isinstance(v, str) and _PERCENT.fullmatch(v):
        return v
    raise ValueError(f"{v!r} is neither a number of instances (1-{MAX_INSTANCES}) nor a percentage of the role's "
                     "instances like '25%' (1% to 100%)")


def resolve_count(value: int | str, total: int) -> int:
    """A CountOrPercent of `total` instances: a count as given; a percentage rounded down, at least 1
    (Kubernetes' maxUnavailable)."""
    if isinstance(value, int):
        return value
    return max(1, total * int(value[:-1]) // 100)


CountOrPercent = Annotated[int | str, BeforeValidator(_count_or_percent),
                           Kind("count or percentage", f"a whole number of instances (1–{MAX_INSTANCES}), or a "
                                "percentage of the role's instances as a string, e.g. `25%`: rounded down, at "
                                "least 1", plural="counts or percentages")]


PORT = Kind("port", "a TCP port number, 1024–65535 unless the type says otherwise", ge=1024, le=65535)
SECONDS = Kind("seconds", f"a whole number of seconds, at most {BASH_SECONDS_MAX} (a week)", plural="seconds",
               le=BASH_SECONDS_MAX)


def Port(**bounds: int):  # noqa: N802 - reads like a type at the use site
    """A TCP port: strict int, 1024..65535 unless bounds say otherwise."""
    return Annotated[int, Field(strict=True, ge=bounds.get("ge", 1024), le=bounds.get("le", 65535)), PORT]


def Seconds(ge: int):  # noqa: N802
    """A duration in whole seconds that bash arithmetic can hold with room to spare."""
    return Annotated[int, Field(strict=True, ge=ge, le=BASH_SECONDS_MAX), SECONDS]


class Settings(BaseModel):
    """The base of every section of the stack file (config.py, monitoring.py): unknown keys are errors,
    values are never coerced, keys are written camelCase."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, alias_generator=to_camel,
                              populate_by_name=False)
