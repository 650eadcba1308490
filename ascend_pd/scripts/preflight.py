"""The per-node preflight checks, rendered from the plan: what the seed guides check by hand.

`preflight_script(plan, node, mode=...)` is one read-only host script (the checks are the functions
of `ascend_pd/shell/preflight_lib.sh`; the values they check against come from the plan, quoted at
the top). Two consumers run the same text:

* `python -m ascend_pd doctor` (mode `report`): one JSON line per check, which doctor parses and
  combines across nodes (clock skew, identical versions and weights, the NPU ping matrix);
* `pulumi up` (the `<node>-preflight` Command, mode `enforce` or `warn`): a line per failure, and
  under `enforce` exit 1, so nothing else on the node starts.

Checks that meet the stack's own processes on a re-run (ports, NPUs) treat whatever runs in this
stack's containers (`docker top`) as expected; huge pages already reserved count as had.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from ..config import HARDWARE_NPUS
from ..plan import Plan
from ..shell import Script, header, library, one_line, params, q, say

# Every check `doctor --only` accepts, in the order the script runs them. `clock` comes first: its
# timestamp is compared with the moment doctor receives the first line. `ping` needs every node's
# NPU addresses, so only doctor runs it (a second round, ping_script).
CHECKS = ("clock", "versions", "page-size", "memory", "npu", "fabric", "ports", "weights", "docker", "network",
          "firewall")
ALL_CHECKS = CHECKS + ("ping",)
_FUNCTIONS = {"page-size": "check_page_size"}
# Proxy variables of the container's env the download check uses, as the preparation steps will.
PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
PYPI_SIMPLE = "https://pypi.org/simple/"
GIB_KIB = 1024 * 1024


def node_ports(plan: Plan, node: str) -> list[tuple[int, str]]:
    """Every TCP port the plan binds on `node`, with who binds it and the setting that moves it."""
    cfg = plan.cfg
    out: list[tuple[int, str]] = [(cfg.yuanrong.port, "worker:yuanrong.port")]
    if node == plan.etcd.node:
        out += [(plan.etcd.client_port, "etcd:etcd.clientPort"), (plan.etcd.peer_port, "etcd-peer:etcd.peerPort")]
    if node == plan.proxy.node:
        out.append((plan.proxy.port, "proxy:proxy.port"))
    for inst in plan.instances:
        role = getattr(cfg, inst.role)
        if inst.dp_address == plan.node(node).address and node == inst.nodes[0]:
            out.append((inst.ranks[0].rpc_port, f"{inst.name}-dp-rpc:{inst.role}.rpcPort"))
        for r in inst.ranks_on(node):
            out.append((r.port, f"{r.name}:{inst.role}.portBase"))
            out += [(role.kv_port + r.dp_rank * r.tp + t, f"{r.name}-kv:{inst.role}.kvPort") for t in range(r.tp)]
    return sorted(set(out))


def registry_of(image: str) -> str:
    """The registry host of an image reference (Docker Hub for `name:tag` and `user/name:tag`)."""
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        return first
    return "registry-1.docker.io"


def download_urls(plan: Plan, node: str) -> tuple[list[str], list[str]]:
    """(needed, optional) URLs the node's preparation steps download from."""
    cfg = plan.cfg
    package = cfg.yuanrong.package
    if re.match(r"https?://", package):
        needed = [package]
    else:
        name = re.split(r"[=<>!~\[ @;]", package)[0].lower().replace("_", "-")
        needed = [f"{PYPI_SIMPLE}{name}/"]
    if any(hasattr(s, "pip") for s in cfg.container.prepare) and PYPI_SIMPLE not in needed:
        needed.append(PYPI_SIMPLE)
    optional = []
    if node == plan.etcd.node and not cfg.etcd.image:  # only when the image has no etcd binary
        optional.append(f"https://github.com/etcd-io/etcd/releases/tag/{cfg.etcd.version}")
    return needed, optional


def _calls(checks: Iterable[str]) -> str:
    lines = []
    for c in checks:
        if c in ("memory", "npu", "ports") and "load_stack_pids" not in lines:
            lines.append("load_stack_pids")
        lines.append(_FUNCTIONS.get(c, "check_" + c.replace("-", "_")))
    return "\n".join(lines) + "\nfinish\n"


def _top(plan: Plan, node: str, mode: str, what: str) -> str:
    cfg = plan.cfg
    hp = cfg.hugepages.gib * GIB_KIB if cfg.hugepages else 0
    shm = 0 if cfg.yuanrong.huge_tlb else cfg.yuanrong.shared_memory_mb * 1024
    needed, optional = download_urls(plan, node)
    containers = [cfg.container.name] + ([plan.etcd.container_name] if plan.etcd.image and node == plan.etcd.node
                                         else [])
    text = header(plan.stack, node, what) + params(
        node=node, report_mode=mode, npus=HARDWARE_NPUS[cfg.hardware],
        hardware="a2" if cfg.hardware == "atlas-800i-a2" else "a3",
        min_cann=cfg.min_cann, min_driver=cfg.min_driver, hugepages_kib=hp, shm_kib=shm,
        ports=" ".join(f"{p}/{owner}" for p, owner in node_ports(plan, node)),
        containers=" ".join(containers), model_path=cfg.model.path, image=plan.node(node).image,
        registry=registry_of(plan.node(node).image), urls=" ".join(needed), optional_urls=" ".join(optional),
        min_free_disk_kib=cfg.preflight.min_free_disk_gib * GIB_KIB,
        min_total_kib=cfg.min_host_memory_gib * GIB_KIB,
        firewall_table=cfg.firewall.table if cfg.firewall.enabled else "",
    )
    env = {k: v for k, v in cfg.container.env.items() if k in PROXY_VARS}
    for k, v in env.items():  # the container's proxy, as the preparation steps will use it
        text += f"export {k}={q(v)}\n"
    return text


def preflight_script(plan: Plan, node: str, *, mode: str = "report", checks: Sequence[str] = CHECKS) -> str:
    """The checks of `node` (read-only); `mode` report (JSON lines), enforce or warn (pulumi up)."""
    if mode not in ("report", "enforce", "warn"):
        raise ValueError(f"preflight mode {mode!r}: report, enforce or warn")
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        raise ValueError(f"unknown preflight check(s) {unknown}; the script runs {list(CHECKS)}")
    ordered = [c for c in CHECKS if c in checks]
    return _top(plan, node, mode, "preflight checks (read-only): " + " ".join(ordered)) + \
        library("preflight_lib") + _calls(ordered)


def ping_script(plan: Plan, node: str, targets: Sequence[tuple[int, str, str]]) -> str:
    """The NPU ping round of doctor: (device, `ping` or `hccs_ping`, peer NPU address) each."""
    for dev, kind, ip in targets:
        if kind not in ("ping", "hccs_ping") or not re.fullmatch(r"[0-9.]+", ip):
            raise ValueError(f"ping target {(dev, kind, ip)!r} is not (device, ping|hccs_ping, IPv4)")
    text = _top(plan, node, "report", f"NPU ping matrix ({len(targets)} pings)")
    text += params(ping_targets=" ".join(f"{d}/{k}/{ip}" for d, k, ip in targets))
    return text + library("preflight_lib", "preflight_ping") + "check_ping\nfinish\n"


def preflight(plan: Plan, node: str) -> Script:
    """The `<node>-preflight` host Command's script (mode from `ascend-pd:preflight.mode`)."""
    mode = plan.cfg.preflight.mode
    if mode == "off":
        raise ValueError("ascend-pd:preflight.mode is off: no preflight script")
    create = preflight_script(plan, node, mode=mode)
    delete = header(plan.stack, node, "preflight checks (nothing to undo)") + \
        say(one_line(f"preflight on {node}: read-only, nothing to undo")) + "\n"
    return Script("preflight", node, "host", create, delete)


__all__ = ["preflight", "preflight_script", "ping_script", "node_ports", "CHECKS", "ALL_CHECKS", "registry_of",
           "download_urls"]
