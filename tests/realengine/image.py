"""The test NPU image: what the rendered steps run inside a node's NPU container, built on a machine
with no registry to pull from (Debian's archive through `debootstrap`, PyPI through pip), then
`docker import`ed and pushed to the fleet's registry (tests/realengine/cluster.py).

What it holds, and why:

* Debian bookworm (minbase) with the tools the in-container scripts call: bash, coreutils, procps
  (ps, pkill), curl, iproute2 (ss), util-linux (setsid), findutils, grep, sed, mawk, numactl (the
  A3 worker's `dscli start --interleave`), git (the patch steps' `git am`), ca-certificates, and
  Debian's etcd-server/etcd-client: the program's `install-etcd` step finds `etcd` and downloads
  nothing, which it could not do here.
* /opt/venv, first on PATH (`ENV PATH` in `changes`), with pip and the openYuanrong worker (dscli,
  its datasystem_worker, `yr.datasystem`) at the version of this checkout's venv, and what the
  release PD proxy imports (fastapi, httpx, uvicorn) plus requests; every package of that closure
  at this venv's version, so the container runs what the local integration tests run.
* /opt/wheels/<the openYuanrong wheel>: a stack's `yuanrong.package` names it, and the prepare
  step's `pip install --no-input <it>` then finds it installed and needs no network.
* /opt/apd-fakes/: tests/fakes' modules and bin/vllm, laid out as in the checkout (bin/vllm finds
  fake_vllm.py as `$(dirname "$0")/../`), and /usr/local/bin/vllm, a wrapper that execs it: a
  symlink would not do, `$0` would then be the link's path.
* /opt/apd-proxy/<version>/load_balance_proxy_server_example.py: each vllm-ascend release's PD
  proxy (tests/proxy_release.py fetches and sha256-checks them).

Docker's `--init` supplies PID 1 (tini) from the daemon's side: nothing for it in the image.

Layout under ${XDG_CACHE_HOME:-~/.cache}/ascend-pd/npu-image/, two cached layers:

    base-<key>/rootfs/      debootstrap's root with the Debian packages; its key is the package
                            list and RECIPE_REV only, so editing a fake never re-runs debootstrap
    image-<key>/rootfs.tar  the image's root filesystem for `docker import -`; its key also covers
                            the pip versions and every byte copied in (fakes, proxy scripts)

A layer is complete once its `done` stamp exists, written last: an interrupted build leaves no
stamp and is redone. Only the newest directory of each layer is kept. The tarball is plain tar:
gzip would only add its compression here and its decompression in `docker import` (measured on 2
cores, 412 MiB: imported in 2.5 s plain, 5.8 s gzipped, plus 7.7 s for `gzip -1`).

debootstrap and everything run in the root run in namespaces of their own (`unshare`): a private
mount namespace, so debootstrap's /proc and /sys and the /proc and /dev mounted into the root for
pip vanish with the process and no cleanup can delete through a leftover mount; and a PID
namespace tied to this process, so a timeout or a killed test session stops the whole tree (dpkg,
pip) instead of leaving it writing into a root the next build is about to remove.

    venv/bin/python tests/realengine/image.py build    # prints the tarball, its size, the time
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
from importlib.metadata import distribution
from pathlib import Path
from typing import Iterator

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
if str(TESTS) not in sys.path:  # run as a script, or imported with only tests/realengine on sys.path
    sys.path.insert(0, str(TESTS))

import proxy_release  # noqa: E402

# Bump on any change to how the image is made that the inputs below do not capture.
RECIPE_REV = 2
SUITE = "bookworm"  # its python3 is 3.11, the CPython the openYuanrong wheels are built for
MIRROR = os.environ.get("ASCEND_PD_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# Beyond minbase (which already has bash, coreutils, util-linux, findutils, grep, sed, mawk).
DEBIAN_PACKAGES = ("procps", "curl", "ca-certificates", "iproute2", "numactl", "git", "etcd-server", "etcd-client",
                   "python3", "python3-venv")
# What the container's python runs, at this venv's versions (with their dependencies).
PIP_PACKAGES = ("openyuanrong-datasystem", "fastapi", "httpx", "uvicorn", "requests")
YUANRONG = "openyuanrong-datasystem"

VENV = "/opt/venv"
WHEELS = "/opt/wheels"
FAKES_DIR = "/opt/apd-fakes"
PROXY_DIR = "/opt/apd-proxy"
IMAGE_PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CHANGES = (f"ENV PATH={IMAGE_PATH}", "ENV LANG=C.UTF-8", 'CMD ["bash"]')

FAKES = TESTS / "fakes"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ascend-pd" / "npu-image"
STAMP = "done"

DEBOOTSTRAP_TIMEOUT = 15 * 60
PIP_TIMEOUT = 10 * 60
COPY_TIMEOUT = 10 * 60
# What the build removes from the root: documentation and translations nothing in the container
# reads (about 50 MB of 300), apt's downloaded packages and indexes (no apt-get at run time).
TRIM = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/lintian", "var/cache/apt", "var/lib/apt/lists")


@dataclasses.dataclass(frozen=True)
class ImageBuild:
    tarball: Path  # the image's root filesystem, for `docker import - REF`
    changes: tuple[str, ...]  # `docker import --change` instructions: PATH with /opt/venv first, LANG, CMD
    key: str  # sha256 of every input; a registry tag can take its first 16 characters
    wheel: str  # the openYuanrong wheel inside the image (a stack's yuanrong.package)
    proxies: dict[str, str]  # vllm-ascend release -> its PD proxy script inside the image


_T0 = time.monotonic()  # reset by each ensure_image: the log's times are since the call


def _log(msg: str) -> None:
    print(f"[npu-image {time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when this process dies, however it dies."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


# A private mount namespace and a PID namespace whose first process (the command) takes every
# other one in it down when killed: on timeout subprocess.run kills `unshare`, --kill-child passes
# that on, and _die_with_parent covers this process itself dying.
SANDBOX = ("unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child")


def _run(argv: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, preexec_fn=_die_with_parent, **kw)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{' '.join(argv[:8])} ... did not finish within {timeout:.0f}s") from e
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:8])} ... exited {proc.returncode}:\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def _digest(*parts: object) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()


# -- the inputs ------------------------------------------------------------------------------------

def pins() -> dict[str, str]:
    """PIP_PACKAGES and everything they require, at the versions installed in this venv (the one
    running this module): the image's pip takes them as constraints, so the container's proxy and
    worker run the libraries the host-side tests run, and a venv upgrade rebuilds the image.

    Markers are evaluated for this interpreter; a pin the image does not need is only ignored by
    pip, and a dependency missing here is resolved by pip as usual."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    todo = [(name, "") for name in PIP_PACKAGES]
    while todo:
        name, extra = todo.pop()
        if (canonicalize_name(name), extra) in seen:
            continue
        seen.add((canonicalize_name(name), extra))
        dist = distribution(name)
        found[canonicalize_name(dist.metadata["Name"])] = dist.version
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": extra}):
                todo += [(req.name, "")] + [(req.name, e) for e in req.extras]
    return dict(sorted(found.items()))


def _fake_files() -> dict[str, bytes]:
    """tests/fakes' python modules and bin/vllm (preflight_bin stands in for host tools: not
    container business), relative path -> bytes."""
    files = sorted(FAKES.glob("*.py")) + [FAKES / "bin" / "vllm"]
    return {str(f.relative_to(FAKES)): f.read_bytes() for f in files}


def _proxy_scripts() -> dict[str, Path]:
    """Each release's PD proxy, fetched (once, sha256-checked) by tests/proxy_release.py."""
    return {v: proxy_release.fetch(v) for v in sorted(proxy_release.RELEASES)}


# -- cache housekeeping ----------------------------------------------------------------------------

def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return [p for p in points if (p + "/").startswith(prefix)]


def _remove(path: Path) -> None:
    """rm -rf, refusing to when anything is mounted below: removing a root with /dev bound into it
    would empty the host's /dev. (The build mounts only in private namespaces; this is the guard
    against whatever else might have.)"""
    if not path.exists():
        return
    mounted = _mounts_under(path)
    if mounted:
        raise RuntimeError(f"not removing {path}: mounted below it: {', '.join(mounted)}")
    shutil.rmtree(path)


def _prune(keep: Path) -> None:
    """Only the newest build of each layer stays: each is hundreds of MB."""
    layer = keep.name.split("-", 1)[0]
    for old in CACHE.glob(f"{layer}-*"):
        if old != keep:
            _remove(old)


def _done(d: Path) -> dict | None:
    try:
        return json.loads((d / STAMP).read_text())
    except (OSError, ValueError):
        return None


def _stamp(d: Path, meta: dict) -> None:
    tmp = d / (STAMP + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1))
    tmp.replace(d / STAMP)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One build at a time per cache (two test sessions starting together would otherwise build
    into, and prune, the same directories)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


# -- running inside the root -----------------------------------------------------------------------

def _host_ca_bundle() -> str | None:
    """The CA bundle this machine's own pip trusts: PyPI may only be reachable through a proxy that
    re-signs TLS with a local CA, which the image's ca-certificates does not hold."""
    for candidate in (os.environ.get("PIP_CERT"), os.environ.get("REQUESTS_CA_BUNDLE"),
                      os.environ.get("SSL_CERT_FILE"), ssl.get_default_verify_paths().cafile,
                      "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def _chroot_env() -> dict[str, str]:
    """A clean environment for the chroot (none of the host's paths mean anything in it), keeping
    how this machine reaches a package index: its proxy and index settings."""
    env = {"PATH": IMAGE_PATH, "HOME": "/root", "LANG": "C.UTF-8", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_NO_INPUT": "1", "PIP_ROOT_USER_ACTION": "ignore", "DEBIAN_FRONTEND": "noninteractive"}
    for var in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "PIP_INDEX_URL",
                "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_DEFAULT_TIMEOUT"):
        if var in os.environ:
            env[var] = os.environ[var]
    return env


def _in_root(root: Path, script: str, *, timeout: float, net: bool = True) -> subprocess.CompletedProcess:
    """`bash -ec script` chrooted into `root` in the SANDBOX, with /proc (the sandbox's own PIDs)
    and the host's /dev mounted in, and without network when `net` is false (the offline checks)."""
    enter = 'mount -t proc proc "$1/proc" && mount --bind /dev "$1/dev" && exec chroot "$1" bash -ec "$2"'
    sandbox = [*SANDBOX] + ([] if net else ["--net"])
    return _run([*sandbox, "sh", "-c", enter, "sh", str(root), script], timeout, env=_chroot_env())


# -- the layers ------------------------------------------------------------------------------------

def _base() -> Path:
    """Debian with DEBIAN_PACKAGES, trimmed: the root filesystem of the base layer."""
    d = CACHE / f"base-{_digest(RECIPE_REV, SUITE, DEBIAN_PACKAGES)[:16]}"
    root = d / "rootfs"
    if _done(d) is not None:
        return root
    _remove(d)
    d.mkdir(parents=True)
    _log(f"debootstrap {SUITE} minbase + {len(DEBIAN_PACKAGES)} packages from {MIRROR}")
    t = time.monotonic()
    _run([*SANDBOX, "debootstrap", "--variant=minbase",
          "--include=" + ",".join(DEBIAN_PACKAGES), SUITE, str(root), MIRROR], DEBOOTSTRAP_TIMEOUT)
    _log(f"debootstrap done in {time.monotonic() - t:.0f}s")
    for sub in TRIM:
        shutil.rmtree(root / sub, ignore_errors=True)
    locale = root / "usr/share/locale"
    for entry in locale.iterdir() if locale.is_dir() else ():
        if entry.name != "locale.alias":  # glibc reads the alias table; the rest are translations
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    (root / "var/lib/apt/lists/partial").mkdir(parents=True)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True)
    # debootstrap copies in this machine's name and resolver; docker supplies both at run time.
    (root / "etc/hostname").write_text("localhost\n")
    (root / "etc/resolv.conf").write_text("")
    _stamp(d, {"suite": SUITE, "packages": list(DEBIAN_PACKAGES), "recipe": RECIPE_REV})
    _prune(d)
    return root


def _install_python(root: Path, versions: dict[str, str]) -> str:
    """/opt/venv with the pinned packages; the openYuanrong wheel kept under /opt/wheels. Returns
    the wheel's path in the image."""
    (root / "tmp/constraints.txt").write_text("".join(f"{n}=={v}\n" for n, v in versions.items()))
    # pip needs a resolver and, behind a re-signing proxy, this machine's CA bundle; the image keeps
    # neither (docker writes its own resolv.conf into each container).
    shutil.copyfile("/etc/resolv.conf", root / "etc/resolv.conf")
    ca = _host_ca_bundle()
    if ca:
        shutil.copyfile(ca, root / "tmp/build-ca.pem")
    cert = "--cert /tmp/build-ca.pem" if ca else ""
    tops = " ".join(f"{p}=={versions[p]}" for p in PIP_PACKAGES if p != YUANRONG)
    try:
        _log(f"venv, pip download {YUANRONG}=={versions[YUANRONG]}, pip install {tops}")
        # The wheel is downloaded by the image's own pip, so its tags are the image's (CPython 3.11,
        # bookworm's glibc), whatever python runs this module; the venv installs that very file.
        _in_root(root, f"""
python3 -m venv {VENV}
{VENV}/bin/pip download {cert} --no-deps --only-binary=:all: -d {WHEELS} {YUANRONG}=={versions[YUANRONG]}
{VENV}/bin/pip install {cert} --no-cache-dir -c /tmp/constraints.txt {WHEELS}/*.whl {tops}
""", timeout=PIP_TIMEOUT)
    finally:
        (root / "etc/resolv.conf").write_text("")
        for f in ("tmp/build-ca.pem", "tmp/constraints.txt"):
            (root / f).unlink(missing_ok=True)
    wheels = sorted((root / WHEELS.lstrip("/")).glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel in {WHEELS}, found {[w.name for w in wheels]}")
    return f"{WHEELS}/{wheels[0].name}"


def _add_fakes(root: Path, files: dict[str, bytes]) -> None:
    dest = root / FAKES_DIR.lstrip("/")
    for rel, data in files.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(data)
    (dest / "bin/vllm").chmod(0o755)
    # Called by its real path, bin/vllm finds fake_vllm.py at $(dirname "$0")/..; a symlink on PATH
    # would make $0 the link's path.
    wrapper = root / "usr/local/bin/vllm"
    wrapper.write_text(f'#!/bin/sh\n# The fake vLLM (tests/fakes).\nexec {FAKES_DIR}/bin/vllm "$@"\n')
    wrapper.chmod(0o755)


def _add_proxies(root: Path, scripts: dict[str, Path]) -> dict[str, str]:
    inside = {}
    for version, path in scripts.items():
        inside[version] = f"{PROXY_DIR}/{version}/{path.name}"
        (root / inside[version].lstrip("/")).parent.mkdir(parents=True)
        shutil.copyfile(path, root / inside[version].lstrip("/"))
    return inside


def _check(root: Path, wheel: str, proxies: dict[str, str]) -> None:
    """What the rendered steps rely on, run offline in the finished root: a broken image fails
    here, with the reason, instead of as a step timing out on every node of a fleet."""
    # dscli starts the worker with the package's lib/ on LD_LIBRARY_PATH (yr/datasystem/cli/start.py).
    package = f"{VENV}/lib/python3.11/site-packages/yr/datasystem"
    proxy_help = "\n".join(f"python3 {p} --help >/dev/null" for p in proxies.values())
    _in_root(root, f"""
export PATH={IMAGE_PATH}
for c in bash ps pkill curl ss setsid numactl git awk sed grep find etcd etcdctl python3 pip dscli vllm; do
  command -v "$c" >/dev/null || {{ echo "missing in the image: $c" >&2; exit 1; }}
done
python3 -c 'import yr.datasystem, fastapi, httpx, uvicorn, requests'
if LD_LIBRARY_PATH={package}/lib ldd {package}/datasystem_worker | grep 'not found'; then
  echo "datasystem_worker lacks libraries" >&2; exit 1
fi
# The prepare step's own command: with no network it succeeds only by finding the wheel installed.
out=$(pip install --no-input {wheel} 2>&1) || {{ echo "$out" >&2; exit 1; }}
vllm serve --help >/dev/null
{proxy_help}
""", timeout=PIP_TIMEOUT, net=False)


def image_key(versions: dict[str, str], fakes: dict[str, bytes], scripts: dict[str, Path]) -> str:
    """Everything the image is made from: any change makes a new image (and registry tag)."""
    return _digest(RECIPE_REV, SUITE, DEBIAN_PACKAGES, versions, CHANGES,
                   {rel: hashlib.sha256(data).hexdigest() for rel, data in fakes.items()},
                   {v: hashlib.sha256(p.read_bytes()).hexdigest() for v, p in scripts.items()})


def ensure_image() -> ImageBuild:
    """The test NPU image, built unless this exact one is already in the cache."""
    global _T0
    _T0 = time.monotonic()
    if os.geteuid() != 0:
        raise RuntimeError("building the test NPU image needs root (debootstrap, chroot, mounts)")
    versions, fakes, scripts = pins(), _fake_files(), _proxy_scripts()
    key = image_key(versions, fakes, scripts)
    d = CACHE / f"image-{key[:16]}"

    def built(meta: dict) -> ImageBuild:
        return ImageBuild(tarball=d / "rootfs.tar", changes=CHANGES, key=key, wheel=meta["wheel"],
                          proxies=meta["proxies"])

    meta = _done(d)
    if meta is not None:
        return built(meta)
    with _locked():
        meta = _done(d)  # another session may have built it while this one waited
        if meta is not None:
            return built(meta)
        base = _base()
        _remove(d)
        d.mkdir(parents=True)
        root = d / "rootfs"
        _log("copying the base layer")
        _run(["cp", "-a", "--reflink=auto", str(base), str(root)], COPY_TIMEOUT)
        wheel = _install_python(root, versions)
        _add_fakes(root, fakes)
        proxies = _add_proxies(root, scripts)
        _log("checking the image offline")
        _check(root, wheel, proxies)
        _log("tar")
        tmp = d / "rootfs.tar.tmp"
        _run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(tmp), "."], COPY_TIMEOUT)
        tmp.rename(d / "rootfs.tar")
        _remove(root)
        meta = {"wheel": wheel, "proxies": proxies, "pins": versions}
        _stamp(d, meta)
        _prune(d)
        _log(f"built {d / 'rootfs.tar'} ({(d / 'rootfs.tar').stat().st_size / 2**20:.0f} MiB)")
        return built(meta)


def main(argv: list[str]) -> int:
    if argv[1:] != ["build"]:
        print("usage: image.py build", file=sys.stderr)
        return 2
    t = time.monotonic()
    b = ensure_image()
    print(f"{b.tarball}  {b.tarball.stat().st_size / 2**20:.0f} MiB  key {b.key[:16]}  {time.monotonic() - t:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
