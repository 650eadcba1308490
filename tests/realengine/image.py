"""The test NPU image: what the rendered steps run inside a node's NPU container, built here with no
registry to pull from (Debian's archive through `debootstrap`, PyPI through pip), then `docker
import`ed and pushed to the fleet's registry (tests/realengine/cluster.py).

It holds Debian bookworm (minbase) with the tools the scripts use (bash, procps, curl, iproute2,
util-linux, numactl, git, jq) and Debian's etcd (the program's `install-etcd` step finds
`etcd` and downloads nothing); a virtualenv /opt/venv first on PATH with the openYuanrong worker
(dscli, datasystem_worker, `yr.datasystem`) at the version of this checkout's venv, and what the
release PD proxy imports (fastapi, httpx, uvicorn); the openYuanrong wheel itself under
/opt/wheels (the stacks' `yuanrong.package` is its requirement, which the prepare step's `pip install`
resolves from there offline, finding everything installed); the fake vLLM (tests/fakes) as `vllm` on
PATH; the proxy script of every release ascend-pd knows under /opt/apd-proxy/<version>/; and a
stand-in of the image's vllm-ascend checkout (a git repository at /vllm-workspace/vllm-ascend whose
AscendStoreConnector lists the backends 0.18.0 has) with a one-commit patch series beside it that
adds the `yuanrong` backend, as seed 003's series does: a stack on 0.18.0 runs its real `git am`
step (ascend_pd/scripts/prepare.py) and passes the release check that asks for it.

Two cached layers under ~/.cache/ascend-pd/npu-image/: the Debian base (keyed by its package
list; about 2 minutes) and the image (keyed by everything copied in: editing a fake rebuilds only
this layer). A layer is complete once its stamp file exists, written last.

    venv/bin/python tests/realengine/image.py build
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import proxy_release  # noqa: E402

RECIPE_REV = 2  # 2: the vllm-ascend stand-in checkout and its patch
SUITE = "bookworm"
MIRROR = os.environ.get("ASCEND_PD_DEBIAN_MIRROR", "http://deb.debian.org/debian")
DEBIAN_PACKAGES = ("bash", "coreutils", "procps", "curl", "ca-certificates", "iproute2", "util-linux", "findutils",
                   "grep", "sed", "gawk", "numactl", "git", "jq", "etcd-server", "etcd-client", "python3",
                   "python3-venv")
PIP_PACKAGES = ("openyuanrong-datasystem", "fastapi", "httpx", "uvicorn", "requests")
FAKES = TESTS / "fakes"
FAKE_FILES = ("fake_vllm.py", "pd_transfer.py", "engine_core.py", "dp_group.py")
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ascend-pd" / "npu-image"
CHANGES = ("ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "ENV LANG=C.UTF-8", 'CMD ["bash"]')


@dataclass(frozen=True)
class ImageBuild:
    tarball: Path  # a root filesystem for `docker import`
    key: str
    wheel: str  # the openYuanrong wheel, inside the image
    proxies: dict = field(default_factory=dict)  # vllm-ascend release -> proxy script inside the image
    patch: str = ""  # the yuanrong-backend patch for REPO, inside the image
    changes: tuple = CHANGES  # `docker import --change` instructions


REPO = "/vllm-workspace/vllm-ascend"
BACKENDS = "vllm_ascend/distributed/kv_transfer/kv_pool/ascend_store/backend/__init__.py"


def _checkout(root: Path) -> str:
    """The vllm-ascend stand-in at REPO and the patch that adds the yuanrong backend to it, made with
    this machine's git. Returns the patch's path inside the image."""
    repo = root / REPO.lstrip("/")
    (repo / BACKENDS).parent.mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.name=ascend-pd-test", "-c", "user.email=test@localhost"]
    _run(["git", "init", "-q", "-b", "main", str(repo)], timeout=60)
    (repo / BACKENDS).write_text('BACKENDS = ["memcache", "mooncake"]\n')
    _run([*git, "add", "-A"], timeout=60)
    _run([*git, "commit", "-q", "-m", "vllm-ascend 0.18.0 (test stand-in)"], timeout=60)
    (repo / BACKENDS).write_text('BACKENDS = ["memcache", "mooncake", "yuanrong"]\n')
    _run([*git, "commit", "-q", "-a", "-m", "Implement yuanrong backend"], timeout=60)
    patches = root / "opt/apd-patches"
    patches.mkdir(parents=True)
    _run([*git, "format-patch", "-q", "-1", "-o", str(patches)], timeout=60)
    _run([*git, "reset", "-q", "--hard", "HEAD~1"], timeout=60)
    (name,) = [p.name for p in patches.iterdir()]
    return f"/opt/apd-patches/{name}"


def _log(t0: float, msg: str) -> None:
    print(f"[image {time.monotonic() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def _key(*parts: object) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else json.dumps(p, sort_keys=True, default=str).encode())
    return h.hexdigest()


def _run(argv: list[str], timeout: float, **kw) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])}... exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def _prune(keep: Path, prefix: str) -> None:
    for old in CACHE.glob(prefix + "*"):
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


def _base(t0: float) -> Path:
    key = _key(RECIPE_REV, SUITE, DEBIAN_PACKAGES)[:16]
    d = CACHE / f"base-{key}"
    if (d / "done").exists():
        return d / "rootfs"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    _log(t0, f"debootstrap {SUITE} ({len(DEBIAN_PACKAGES)} packages) into {d}")
    _run(["debootstrap", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}", SUITE, str(d / "rootfs"),
          MIRROR], timeout=1200)
    root = d / "rootfs"
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info"):
        shutil.rmtree(root / junk, ignore_errors=True)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    (d / "done").write_text(key)
    _prune(d, "base-")
    return root


def _wheels(dest: Path, pins: dict[str, str]) -> Path:
    """Wheels of the pinned packages and their dependencies, downloaded by this machine's pip (its
    index, proxy and certificates), for the image's CPython 3.11 on x86_64 glibc: the chroot then
    installs them with no network. Returns the openYuanrong wheel."""
    dest.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(dest),
          *[f"{p}=={v}" for p, v in pins.items()]], timeout=900)
    found = sorted(dest.glob("openyuanrong_datasystem-*.whl"))
    if not found:
        raise RuntimeError(f"pip downloaded no openyuanrong_datasystem wheel into {dest}")
    return found[-1]


def ensure_image() -> ImageBuild:
    t0 = time.monotonic()
    proxies = {v: proxy_release.fetch(v) for v in proxy_release.RELEASES}
    pins = {p: version(p) for p in PIP_PACKAGES}
    fakes = {f: (FAKES / f).read_bytes() for f in FAKE_FILES}
    key = _key(RECIPE_REV, SUITE, DEBIAN_PACKAGES, pins, CHANGES,
               {f: hashlib.sha256(b).hexdigest() for f, b in fakes.items()},
               {v: hashlib.sha256(p.read_bytes()).hexdigest() for v, p in proxies.items()})
    d = CACHE / f"image-{key[:16]}"
    tarball = d / "rootfs.tar"
    meta = d / "done"
    if meta.exists():
        m = json.loads(meta.read_text())
        return ImageBuild(tarball=tarball, key=key, wheel=m["wheel"], proxies=m["proxies"], patch=m["patch"])
    base = _base(t0)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    root = d / "rootfs"
    _log(t0, "copying the base")
    _run(["cp", "-a", str(base), str(root)], timeout=600)
    _log(t0, f"pip download: {pins}")
    wheel = _wheels(root / "tmp/wheels", pins)
    (root / "opt/wheels").mkdir(parents=True)
    shutil.copy(wheel, root / "opt/wheels" / wheel.name)
    mounts = []
    try:
        for src, dst in (("/proc", "proc"), ("/dev", "dev")):
            _run(["mount", "--rbind", src, str(root / dst)], timeout=30)
            mounts.append(root / dst)
        _log(t0, "pip install (offline)")
        _run(["/usr/sbin/chroot", str(root), "python3", "-m", "venv", "/opt/venv"], timeout=300)
        env = {"PATH": "/opt/venv/bin:/usr/bin:/bin", "HOME": "/root", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
               "LANG": "C.UTF-8"}
        _run(["/usr/sbin/chroot", str(root), "/opt/venv/bin/pip", "install", "--no-cache-dir", "-q", "--no-index",
              "--find-links", "/tmp/wheels", *[f"{p}=={v}" for p, v in pins.items()]], timeout=900, env=env)
    finally:
        for m in reversed(mounts):
            subprocess.run(["umount", "-R", "-l", str(m)], capture_output=True)
    shutil.rmtree(root / "tmp/wheels")
    fk = root / "opt/apd-fakes"
    (fk / "bin").mkdir(parents=True)
    for f, b in fakes.items():
        (fk / f).write_bytes(b)
    # `vllm` on PATH: the fake's own wrapper, which finds fake_vllm.py beside its real location.
    (root / "usr/local/bin/vllm").write_text('#!/bin/sh\nexec python3 /opt/apd-fakes/fake_vllm.py "$@"\n')
    (root / "usr/local/bin/vllm").chmod(0o755)
    inside = {}
    for v, p in proxies.items():
        (root / f"opt/apd-proxy/{v}").mkdir(parents=True)
        shutil.copy(p, root / f"opt/apd-proxy/{v}/{p.name}")
        inside[v] = f"/opt/apd-proxy/{v}/{p.name}"
    patch = _checkout(root)
    _log(t0, "tar")
    _run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(tarball), "."], timeout=900)
    shutil.rmtree(root, ignore_errors=True)
    meta.write_text(json.dumps({"wheel": f"/opt/wheels/{wheel.name}", "proxies": inside, "patch": patch}))
    _prune(d, "image-")
    _log(t0, f"built {tarball} ({tarball.stat().st_size // 2**20} MiB)")
    return ImageBuild(tarball=tarball, key=key, wheel=f"/opt/wheels/{wheel.name}", proxies=inside, patch=patch)


if __name__ == "__main__":
    if sys.argv[1:] != ["build"]:
        sys.exit("usage: image.py build")
    t = time.monotonic()
    b = ensure_image()
    print(f"{b.tarball} {b.tarball.stat().st_size // 2**20} MiB, key {b.key[:16]}, {time.monotonic() - t:.1f}s")
