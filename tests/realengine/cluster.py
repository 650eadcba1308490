"""One stack deployed by the real engine onto a fleet of real nodes: the fleet
(tests/realengine/nodes.py), the test NPU image in its registry (tests/realengine/image.py), a
Pulumi project for the stack (tests/realengine/engine.py), and the checks an operator makes
afterwards (`ascend-pd status`, `heal`, what is left on a node).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import engine
import image as image_build
import nodes
import stacks
from proxy_key import TEST_PROXY_KEY

from ascend_pd.secrets import PROXY_KEY_ENV, placeholder

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ascend-pd"
ASCEND_PD = [sys.executable, "-m", "ascend_pd"]
# Processes a deployment starts on a node (inside its containers), as `ps -eo args` shows them.
SERVICE_MARKERS = ("datasystem_worker", "fake_vllm.py", "load_balance_proxy_server", "pd_proxy_launch", "etcd --")
PLANTED_NAME = "HF_TOKEN"  # set with `pulumi config set --secret --path ascend-pd:vllm.env.HF_TOKEN`
PLANTED_SECRET = "hf_plantedRealEngine7q2w9e4r1t6y"


def skip_reason() -> Optional[str]:
    return nodes.can_run() or engine.missing()


def require_real_engine() -> None:
    """Skip the calling test when the real engine cannot run here, saying how to get it; under
    CI=true fail instead: CI must never pass without having run it."""
    import pytest

    why = skip_reason()
    if why is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and the real engine cannot run: {why}", pytrace=False)
    pytest.skip(why)


@dataclasses.dataclass(frozen=True)
class Image:
    """The test image as a stack refers to it."""

    ref: str
    wheel: str
    proxies: dict
    patch: str  # the yuanrong-backend patch for the image's stand-in vllm-ascend checkout


class RealCluster:
    """`stack` on `len(stack's nodes)` real nodes, deployed and changed by the real engine."""

    def __init__(self, stack: str, workdir: Path, *, spare: int = 0, upgrade: bool = False, **overrides: Any) -> None:
        """`spare` nodes beyond the stack's (x0, x1, ...): machines a scenario adds to the stack;
        `upgrade`: the stack upgraded to vllm-ascend 0.23.0.post1 as docs/changes.md says."""
        self.stack = stack
        self.upgrade = upgrade
        # What the stack keeps secret: the proxy's key, and a value planted in vllm.env that must be
        # found nowhere in clear (test_lifecycle.py: the preview, the state, ps, the logs, the bundle).
        self.secrets = {"proxyApiKey": TEST_PROXY_KEY, f"vllm.env.{PLANTED_NAME}": PLANTED_SECRET}
        self.workdir = workdir
        names = [n["name"] for n in stacks.settings(stack)["nodes"]] + [f"x{i}" for i in range(spare)]
        self.fleet = nodes.Fleet(names, workdir / "fleet", npus=16 if stack.startswith("a3") else 8)
        try:
            self.image = self._publish_image()
            self.project = engine.Project(workdir / "project", stack, ssh_config=self.fleet.ssh_config)
            self.private_key = self.fleet.key.read_text()
            self.overrides = overrides
            self.configure()
        except BaseException:
            self.fleet.close()
            raise

    def _publish_image(self) -> Image:
        build = image_build.ensure_image()
        storage = CACHE / "registry" / build.key[:16]
        for old in storage.parent.glob("*"):  # one image's blobs kept, not every edit's
            if old != storage:
                shutil.rmtree(old, ignore_errors=True)
        self.fleet.start_registry(storage)
        ref = f"{self.fleet.registry}/ascend-pd-test/npu:{build.key[:16]}"
        self.push_seconds = 0.0
        if not self.fleet.has_image(ref):
            self.push_seconds = self.fleet.push_image(build.tarball, build.changes, ref)
        return Image(ref=ref, wheel=build.wheel, proxies=build.proxies, patch=build.patch)

    def rebuild(self, tag: str) -> str:
        """The test image as a rebuild of it under `tag` in the fleet's registry: the same layers with
        a label added to its configuration, so a new image ID, as a rebuilt image has (the same
        manifest under another tag would resolve to the same ID, and docker would replace nothing).
        Done with the Registry API v2: the new configuration blob, then the manifest naming it."""
        import hashlib

        import requests

        repo, old_tag = self.image.ref.split("/", 1)[1].rsplit(":", 1)
        base = f"http://{self.fleet.registry}/v2/{repo}"
        kinds = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
        got = requests.get(f"{base}/manifests/{old_tag}", headers={"Accept": kinds}, timeout=30)
        got.raise_for_status()
        manifest = got.json()
        config = requests.get(f"{base}/blobs/{manifest['config']['digest']}", timeout=60)
        config.raise_for_status()
        doc = config.json()
        doc.setdefault("config", {}).setdefault("Labels", {})
        doc["config"]["Labels"] = {**(doc["config"]["Labels"] or {}), "org.ascend-pd.test.rebuild": tag}
        blob = json.dumps(doc).encode()
        digest = "sha256:" + hashlib.sha256(blob).hexdigest()
        upload = requests.post(f"{base}/blobs/uploads/", timeout=30)
        upload.raise_for_status()
        location = upload.headers["Location"]
        location = location if location.startswith("http") else f"http://{self.fleet.registry}{location}"
        put = requests.put(location, params={"digest": digest}, data=blob, timeout=60,
                           headers={"Content-Type": "application/octet-stream"})
        put.raise_for_status()
        manifest["config"] = {**manifest["config"], "digest": digest, "size": len(blob)}
        put = requests.put(f"{base}/manifests/{tag}", data=json.dumps(manifest).encode(), timeout=30,
                           headers={"Content-Type": got.headers["Content-Type"]})
        put.raise_for_status()
        return f"{self.fleet.registry}/{repo}:{tag}"

    # -- the stack -------------------------------------------------------------------------------

    def settings(self, **overrides: Any) -> dict[str, Any]:
        return stacks.on_fleet(self.stack, self.fleet, self.image, upgrade=self.upgrade, **{**self.overrides, **overrides})

    def configure(self, **overrides: Any) -> dict[str, Any]:
        """Write the stack file (the base overrides plus these) as the next `up` will read it, with the
        proxy's key and the planted secret set as an operator sets them (`config set --secret`)."""
        s = self.settings(**overrides)
        self.project.configure(s, private_key=self.private_key, secrets=self.secrets)
        return s

    def model_graph(self, **overrides: Any):
        """The program's registrations for the stack as it is configured, under the SDK's mocks: what
        `diff` and the engine model (ascend_pd/engine) reason about."""
        from ascend_pd.engine.capture import capture

        config = {f"ascend-pd:{k}": v if isinstance(v, str) else json.dumps(v)
                  for k, v in self.as_diff_sees(self.settings(**overrides)).items()}
        config["ascend-pd:sshPrivateKey"] = self.private_key
        config["ascend-pd:proxyApiKey"] = TEST_PROXY_KEY
        return capture(config, stack=self.stack, secret_keys=["ascend-pd:sshPrivateKey", "ascend-pd:proxyApiKey"])

    @staticmethod
    def as_diff_sees(settings: dict[str, Any]) -> dict[str, Any]:
        """`settings` with the planted secret where the stack file holds it, as `render` and `diff` read
        it: its placeholder in vllm.env (so their graphs have the `<node>-secrets` files the engine has)."""
        out = json.loads(json.dumps(settings))
        out.setdefault("vllm", {}).setdefault("env", {})[PLANTED_NAME] = placeholder("the planted secret")
        return out

    @property
    def stack_file(self) -> Path:
        return self.project.stack_file

    # -- what an operator runs afterwards ----------------------------------------------------------

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """`ascend-pd ARGS --stack-file <this stack>` from the test's own environment, with the proxy's
        key exported as an operator exports it for status."""
        env = {**os.environ, **self.project.env, "NO_PROXY": "*", PROXY_KEY_ENV: TEST_PROXY_KEY}
        for v in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
            env.pop(v, None)
        return subprocess.run([*ASCEND_PD, *args, "--stack-file", str(self.stack_file)], capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=str(self.project.dir))

    def status(self, *extra: str) -> tuple[int, dict]:
        p = self.cli("status", "--json", *extra)
        try:
            report = json.loads(p.stdout) if p.stdout.strip() else {}
        except json.JSONDecodeError:
            report = {"unparsed": p.stdout}
        report.setdefault("_stderr", p.stderr[-3000:])
        return p.returncode, report

    def wait_serving(self, timeout: float = 120) -> dict:
        """status exits 0 (every rank, worker, etcd and the proxy healthy, the P/D smoke through the
        proxy passed) within `timeout`; the last report otherwise, in the assertion."""
        deadline = time.monotonic() + timeout
        while True:
            rc, report = self.status()
            if rc == 0:
                return report
            if time.monotonic() > deadline:
                raise AssertionError(f"status exited {rc} for {timeout:.0f}s: {json.dumps(report)[:4000]}")
            time.sleep(3)

    def heal(self) -> subprocess.CompletedProcess:
        return self.cli("heal", "--identity", str(self.fleet.key), "--known-hosts", str(self.fleet.known_hosts),
                        timeout=600)

    def leftovers(self, name: str) -> dict[str, Any]:
        """What a deployment leaves on node `name` after destroy: containers, service processes,
        listening ports other than sshd's, huge pages, the host files ascend-pd writes."""
        n = self.fleet.nodes[name]
        containers = n.docker("ps", "-aq").stdout.split()
        procs = [line for line in n.sh("ps -eo args=").stdout.splitlines()
                 if any(m in line for m in SERVICE_MARKERS)]
        ports = sorted({line.split()[3].rsplit(":", 1)[1] for line in n.sh("ss -ltnH").stdout.splitlines()
                        if line.strip()} - {"22"})
        files = [f for f in ("/etc/sysctl.d/90-ascend-pd-hugepages.conf", "/var/lib/ascend-pd/nr_hugepages.before",
                             "/etc/sysctl.d/90-ascend-pd-tcp.conf", "/var/lib/ascend-pd/tcp_retries2.before",
                             "/tmp/etcd-data") if n.sh(f"test -e {f}", check=False).returncode == 0]
        pages = n.sh("cat /proc/sys/vm/nr_hugepages").stdout.strip()
        tcp = n.sh("cat /proc/sys/net/ipv4/tcp_retries2").stdout.strip()
        return {"containers": containers, "processes": procs, "ports": ports, "files": files, "hugepages": pages,
                "tcp_retries2": tcp}

    def close(self) -> None:
        self.fleet.close()
