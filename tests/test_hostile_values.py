"""Values are data: no stack value can become shell code.

Every string setting of StackConfig (found by walking the model's field types, so a new setting is
covered the day it is added), every flag and env key and value, each set to hostile text (command
substitution, backticks, quotes of both kinds, a newline, the heredoc delimiter as a line, a leading
dash, an empty string; each also behind a leading /tmp/ to pass path checks). Each is either refused
with a message naming the setting, or rendered into scripts that, wrapped exactly as Pulumi sends
them and run for real (stub commands, an unprivileged user), execute nothing injected, pass `bash -n`
(the wrappers `sh -n`), and succeed.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
import traceback
from pathlib import Path

import pytest

from hostile_support import INJECTIONS, Sandbox, hostile_values, bash_n, setting_prefix, string_paths, with_value

from ascend_pd import scripts, shell
from ascend_pd.config import StackConfig
from ascend_pd.errors import ConfigError
from ascend_pd.loader import cli_config_map, load_config
from ascend_pd.plan import build_plan

pytestmark = pytest.mark.integration

STACK = "a3-4node"
# Run-time refusals of values that are well-formed but name nothing real (the script stops safely).
EXPECTED_REFUSALS = ("is missing on", "is not found in the container", "could not download")


# Settings whose paths a node keeps to itself (base_settings puts them under each node's directory).
NODE_OWN = {"ascend-pd:stateDir", "ascend-pd:yuanrong.livenessPath"}


def base_settings(root: Path, node_dir: Path, *, image_mode: bool) -> dict:
    """The a3 stack with every optional string setting present, its paths inside the sandbox; the
    paths a node keeps to itself (state, liveness) under `node_dir`: every node runs here, on one
    filesystem, so each renders its own scripts from a plan with its own directories."""
    data = {k: json.loads(v) if v[:1] in "[{" else v for k, v in cli_config_map(STACK).items()}
    patches = root / "patches"
    patches.mkdir(exist_ok=True)
    for step in data["container"]["prepare"]:
        if "patches" in step:
            step["patches"] = [str(patches / Path(p).name) for p in step["patches"]]
            for p in step["patches"]:
                Path(p).write_text("patch\n")
    data["container"]["extraMounts"] = [{"host": "/models", "container": "/models", "readOnly": True}]
    data["container"]["env"] = {"https_proxy": "http://proxy.example:3128"}
    data["ssh"]["hostKeys"]["p1"] = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPinned"  # every node stays pinned
    data["nodes"][0]["formerNames"] = ["p9"]
    data["yuanrong"].update(flags={"rpc_thread_num": "8"}, livenessPath=str(node_dir / "live"), interleave="0-7")
    data["etcd"]["dataDir"] = str(root / "etcd")
    # The stub proxy never drops an instance: a restart of a serving one gives up its drain at once.
    data["rollout"] = {"drainTimeoutS": 1}
    # The sandbox has no NPU, no docker daemon and no internet: every check fails there, so the
    # preflight script runs to its end (every value it renders is exercised) and reports, not stops.
    data["preflight"] = {"mode": "warn"}
    if image_mode:
        data["etcd"].update(image="quay.io/coreos/etcd:v3.5.12", containerName="my-etcd")
        data["etcd"].pop("version", None)
    else:
        data["etcd"]["version"] = "v3.5.12"
    data["stateDir"] = str(node_dir / "state")
    # Every default written out, so that settings the stack file leaves alone are tried too.
    return load_config(cli_map(data)).model_dump(mode="json", by_alias=True, exclude_none=True)


def cli_map(data: dict) -> dict[str, str]:  # noqa: D103 - as the CLI passes settings
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in data.items()}


def rendered(plans: dict, root: Path) -> dict[tuple[str, str, str], tuple[str, str]]:
    """(node, script, kind) -> (inner text, the command Pulumi runs), each node from its own plan."""
    out = {}
    for name, plan in plans.items():
        node = plan.node(name)
        for s in scripts.node_scripts(plan, node.name):
            if s.name == "hugepages":  # the host script on fake /proc files (it writes nr_hugepages)
                s = scripts.hugepages(plan, node.name, meminfo=str(root / "meminfo"),
                                      nr_hugepages=str(root / "nr_hugepages"), sysctl_file=str(root / "sysctl.conf"),
                                      state_file=str(root / "hp.before"))
            for kind in ("create", "delete"):
                text = getattr(s, kind)
                wrapped = shell.on_host(text) if s.where == "host" else \
                    shell.in_container(plan.cfg.container.name, text, lock=scripts.script_locks(plan).of(s.name),
                                       delete=kind == "delete")
                out[(node.name, s.name, kind)] = (text, wrapped)
    return out


@pytest.fixture()
def sandbox_dir():
    """Outside pytest's private (0700) tmp tree: the unprivileged user must reach the stubs."""
    d = Path(tempfile.mkdtemp(prefix="apd-hostile-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


# About 1700 changed scripts run (2086 values tried): 302 s on an idle 2-core machine (1230 s before
# the namespace reaped its orphans and the stubs stopped at SIGTERM).
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("image_mode", [False, True], ids=["etcd-binary", "etcd-image"])
def test_no_value_becomes_code(sandbox_dir: Path, image_mode: bool):
    sandbox = Sandbox(sandbox_dir / "sb", etcd_in_container=image_mode)
    (sandbox.root / "meminfo").write_text("MemAvailable: 1000 kB\nHugePages_Total: 256000\nHugepagesize: 2048 kB\n")
    (sandbox.root / "nr_hugepages").write_text("0\n")
    for f in ("meminfo", "nr_hugepages"):
        (sandbox.root / f).chmod(0o666)
    names = [n["name"] for n in json.loads(cli_config_map(STACK)["nodes"])]
    bases = {}
    for name in names:
        node_dir = sandbox.root / name
        node_dir.mkdir()
        node_dir.chmod(0o777)
        (node_dir / "paths").mkdir()
        (node_dir / "paths").chmod(0o777)
        bases[name] = base_settings(sandbox.root, node_dir, image_mode=image_mode)
    base = bases[names[0]]
    base_plan = build_plan(load_config(cli_map(base)), STACK)
    baseline = rendered({n: build_plan(load_config(cli_map(b)), STACK) for n, b in bases.items()}, sandbox.root)
    paths = list(string_paths(StackConfig, base))
    # Every kind of string setting is reached (the walk found them, not a list kept by hand).
    flat = {setting_prefix(p) for p in paths}
    for expected in ("ascend-pd:container.name", "ascend-pd:container.prepare[0].pip[0]",
                     "ascend-pd:container.prepare[2].repo", "ascend-pd:vllm.flags", "ascend-pd:vllm.env",
                     "ascend-pd:prefill.env", "ascend-pd:yuanrong.flags", "ascend-pd:etcd.dataDir",
                     "ascend-pd:model.servedName", "ascend-pd:proxy.python", "ascend-pd:stateDir",
                     "ascend-pd:nodes[0].formerNames[0]", "ascend-pd:ssh.hostKeys", "ascend-pd:container.envFiles[0]"):
        assert expected in flat, expected
    counts = (len(base_plan.proxy.prefillers), len(base_plan.proxy.decoders))

    if image_mode:  # the image-mode variant adds only etcd's own settings
        paths = [p for p in paths if p[0] == "etcd"]
    pool = ThreadPoolExecutor(max_workers=8)
    refused = accepted = runs = tried = 0
    tracebacks, unnamed, syntax, failures = [], [], [], []
    took: dict[str, float] = {}  # per setting: where the sweep's time goes (printed with the counts)

    def attempt(path: tuple, value: str) -> bool:
        """Render `value` at `path` and run what changed; True when the config refused it."""
        nonlocal refused, accepted, runs, tried
        tried += 1
        try:
            plans = {n: build_plan(load_config(cli_map(with_value(b, path, own_path(value, path, n)))), STACK)
                     for n, b in bases.items()}
        except ConfigError as exc:
            refused += 1
            if setting_prefix(path) not in str(exc):
                unnamed.append((path, value, str(exc)))
            return True
        except Exception:  # noqa: BLE001 - every traceback is a finding
            tracebacks.append((path, value, traceback.format_exc()))
            return False
        accepted += 1
        try:
            texts = rendered(plans, sandbox.root)
        except Exception:  # noqa: BLE001
            tracebacks.append((path, value, traceback.format_exc()))
            return False
        changed = {k: t for k, t in texts.items() if baseline.get(k) != t}
        for key, (inner, wrapped) in list(changed.items()):
            if bash_n(inner).returncode or bash_n(wrapped, "sh").returncode:
                syntax.append((path, value, key))
                del changed[key]
        # Creates together, then deletes together (a delete stops what creates started).
        for kind in ("create", "delete"):
            batch = [(k, w) for k, (_, w) in changed.items() if k[2] == kind]
            runs += len(batch)
            for key, r in zip([k for k, _ in batch], pool.map(lambda kw: sandbox.run(kw[1], counts=counts), batch)):
                if r.returncode and not any(m in r.stderr for m in EXPECTED_REFUSALS):
                    failures.append((path, value, key, r.returncode, r.stderr[-400:]))
        return False

    def own_path(value: str, path: tuple, node: str) -> str:
        """A path a node keeps to itself, under that node's directory: with one stateDir for all, each
        node's launch saw the other nodes' ranks in its run dir as unplanned and stopped them (a CI failure)."""
        shared = f"{sandbox.root}/paths/"
        if setting_prefix(path) in NODE_OWN and value.startswith(shared):
            return f"{sandbox.root}/{node}/paths/" + value[len(shared):]
        return value

    t0 = time.monotonic()
    for path in paths:
        t_path = time.monotonic()
        # Each injection as it is, and behind the sandbox path only where the bare text was refused
        # (a path check): a setting that takes the bare text learns nothing from the longer one.
        for bare, as_path in zip(INJECTIONS, hostile_values(sandbox.root)[1::2]):
            if attempt(path, bare):
                attempt(path, as_path)
        took[setting_prefix(path)] = took.get(setting_prefix(path), 0.0) + time.monotonic() - t_path
    pool.shutdown()
    elapsed = time.monotonic() - t0
    report = (f"{len(paths)} string settings x {len(INJECTIONS)} injections ({tried} values tried): {refused} refused, {accepted} accepted, "
              f"{runs} changed scripts run in {elapsed:.0f}s")
    print(report)
    print("slowest settings:", ", ".join(f"{k} {v:.0f}s" for k, v in sorted(took.items(), key=lambda kv: -kv[1])[:8]))
    assert not tracebacks, tracebacks[:3]
    assert not unnamed, unnamed[:5]
    assert sandbox.executions() == "", f"injected commands ran: {sandbox.executions()}"
    assert not syntax, syntax[:5]
    assert not failures, failures[:5]
    # The image variant's etcd values reach the etcd container's argv (a list, no shell), not scripts.
    assert refused and accepted and (image_mode or runs > 50), report
