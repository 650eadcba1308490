"""The committed stacks, remapped onto a fleet of real nodes (tests/realengine/nodes.py).

The stack file is loaded exactly as the Pulumi CLI hands it to the program, then only what one
machine cannot hold changes: the nodes' addresses and NIC, SSH (root, the fleet's pinned host
keys), the image (the test NPU image from the fleet's registry), sizes (decode DP 8 instead of 32,
64 MiB of openYuanrong shared memory, 1 GiB of huge pages), timeouts, and what would reach the
internet (the openYuanrong wheel and the proxy script are in the image). Topology, roles, ports,
etcd and proxy placement, flags and env stay the stack's: the plan's validation runs on the result.
"""

from __future__ import annotations

import json
from typing import Any

import image as image_build
import release_upgrade
from quiet_worker import QUIET_WORKER_FLAGS

from ascend_pd import releases
from ascend_pd.loader import cli_config_map

PROJECT = "ascend-pd"
# The a2 decode group is DP32 over 4 nodes; 8 fake ranks (2 per node) keep the topology.
SHRINK = {"a2-8node": {"decode": {"dp": 8}}, "a3-4node": {}}
MODEL_DIR = "/data/model"  # the fake vLLM reads no weights


def settings(stack: str) -> dict[str, Any]:
    """The stack's settings as the program reads them (namespace stripped, objects decoded)."""
    out = {}
    for k, v in cli_config_map(stack).items():
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def on_fleet(stack: str, fleet, image, *, names: list[str] | None = None, upgrade: bool = False,
             **overrides) -> dict[str, Any]:
    """The stack remapped onto `fleet` (node i of the stack on the fleet's node i), pulling `image`
    (an ImageBuild pushed as `image.ref`); with `upgrade`, the stack upgraded to vllm-ascend
    0.23.0.post1 as docs/changes.md says (tests/release_upgrade.py) first. `overrides` replace
    top-level settings one level deep (a dict merges into the setting, None removes it).

    The test image's tag names no release: `vllmAscend.release` keeps the one the stack's own image
    runs, which picks the release's proxy script in the image and the checks the plan applies. The
    openYuanrong worker is installed as the requirement pip resolves for the image's Python, offline
    from the image's /opt/wheels (PIP_NO_INDEX, PIP_FIND_LINKS in the container's env), as a
    cluster without an index would."""
    raw = release_upgrade.upgraded(settings(stack)) if upgrade else settings(stack)
    release = releases.release_named(raw["container"]["image"], raw.get("vllmAscend", {}).get("release"))
    raw["vllmAscend"] = {**raw.get("vllmAscend", {}), "release": release}
    nodes = raw["nodes"]
    if names:  # the stack's node names, renamed (formerNames and all) by a scenario
        nodes = names
    fleet_nodes = list(fleet.nodes.values())
    raw["nodes"] = [{**n, "address": fleet_nodes[i].address, "nic": "eth0"} for i, n in enumerate(nodes)]
    raw["ssh"] = {
        "user": "root",
        "port": 22,
        "hostKeys": {n["name"]: fleet_nodes[i].host_key for i, n in enumerate(raw["nodes"])},
        # A node that is down fails a command in seconds, not the 10 minutes a rebooting server needs.
        "dialErrorLimit": 3,
        "perDialTimeoutS": 5,
    }
    c = raw["container"]
    c.update(image=image.ref, shmSize="1g", pullTimeoutS=600,
             env={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": image.wheel.rsplit("/", 1)[0]})
    # The stacks' pip and patch steps reach PyPI and the image's vLLM sources; one offline pip step
    # keeps a preparation step beyond the worker's install in the chain, and a stack that patches
    # the yuanrong backend into vllm-ascend (a3 on 0.18.0) applies the image's stand-in patch to
    # the image's stand-in checkout (tests/realengine/image.py) with the same `git am` step.
    patched = any(str(s.get("repo", "")).rstrip("/").endswith("vllm-ascend") for s in c.get("prepare") or [])
    c["prepare"] = ([{"pip": ["--no-index", "--no-deps", image.wheel]}] if c.get("prepare") else []) + \
        ([{"repo": image_build.REPO, "patches": [image.patch]}] if patched else [])
    for role in ("prefill", "decode"):
        raw[role].pop("image", None)
    raw["model"] = {**raw["model"], "path": MODEL_DIR}
    raw["vllm"] = {**raw.get("vllm", {}), "readyTimeoutS": 60, "stopTimeoutS": 5}
    y = raw["yuanrong"]
    wheel_version = image.wheel.rsplit("/", 1)[1].split("-")[1]
    y.update(package=f"openyuanrong-datasystem=={wheel_version}", sharedMemoryMb=64, hugeTlb=False, startTimeoutS=120, stopTimeoutS=10,
             nodeTimeoutS=5, nodeDeadTimeoutS=10, flags={**QUIET_WORKER_FLAGS, **y.get("flags", {})})
    y.pop("interleave", None)  # numactl --interleave over NUMA nodes this machine does not have
    if "hugepages" in raw:
        raw["hugepages"] = {"gib": 1}  # the node's own vm.nr_hugepages (node_init.sh)
    raw["etcd"] = {**raw["etcd"], "startTimeoutS": 30}
    raw["proxy"] = {**raw["proxy"], "script": image.proxies[release], "python": "python3",
                    "readyTimeoutS": 120, "smokeTimeoutS": 60}
    # The fake nodes have no RoCE fabric or CANN: the gate is tested against fake Ascend nodes
    # behind sshd (tests/test_preflight_doctor.py).
    raw["preflight"] = {"mode": "off"}
    # The firewall on: the test machine (the bridge's address) is the operator that runs status and heal.
    raw["firewall"] = {"operators": [fleet.gateway]}
    # The shrink first, then the test's overrides on top of it (an override of `decode.flags` keeps
    # the shrunk `decode.dp`).
    for layer in (SHRINK[stack], overrides):
        for key, value in layer.items():
            if value is None:
                raw.pop(key, None)
            elif isinstance(value, dict) and isinstance(raw.get(key), dict):
                raw[key] = {**raw[key], **value}
            else:
                raw[key] = value
    return raw
