"""The published artifacts a release's facts are read from: the vllm-ascend and vLLM source
distributions on PyPI, sha256-pinned here, downloaded once into the user's cache.

A vLLM-Ascend image builds vLLM from the git tag its Dockerfile names (`VLLM_TAG`), not from a
wheel, so vLLM is read from the source distribution of that tag too: the same files the image
runs, and a tenth of a wheel's size (30 MB, not 400). Only the Python sources, the Dockerfiles and
the docs' configuration are extracted (`source_tree`); nothing here is ever imported.

To add a release: `python -m tools.release_facts --pins VERSION VLLM_VERSION` prints the sha256 of both sdists
as PyPI's index states them (PEP 503 `#sha256=`); check them, add them to PINS, then run
`python -m tools.release_facts VERSION` to write its facts file.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tarfile
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

INDEX = os.environ.get("ASCEND_PD_PYPI_SIMPLE", "https://pypi.org/simple").rstrip("/")
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ascend-pd" / "releases"


@dataclass(frozen=True)
class Pin:
    """One release: the sha256 of its vllm-ascend sdist, and the vLLM release its images build with
    the sha256 of that sdist."""

    vllm_ascend_sha256: str
    vllm: str
    vllm_sha256: str


# vllm-ascend release -> its sdists (pypi.org/simple/vllm-ascend/ and /vllm/, `#sha256=` of each link).
PINS = {
    "0.18.0": Pin("8df042cfaae06fab993bff5f38bb45097634c3f398b2cf74e068347abdddb344",
                  "0.18.0", "9a1bee091db8dbb4664a2a09cd9c61912e9912a44af1ce12b8593a231d05971c"),
    "0.20.2rc1": Pin("8ebd5c5b2ef5009baae1c5ddee390a0fe2821ef31aa33312a0b491f5b5185797",
                     "0.20.2", "58809377798c5335c6e2fe30092abda54d9200b5b8a717b3735a63f5daa0e383"),
    "0.23.0.post1": Pin("a3b9f4a5dd7aa50c37e03d1f35937c4ae5aeacc49b734cac74d59ce5757738e1",
                        "0.23.0", "760269db3d9611e12e524681df1bca0977d5d2f5fcb4481cc34d33efc4ae7ff5"),
}

# What of an sdist the facts are read from (paths below its top directory).
_KEEP = re.compile(r"(vllm|vllm_ascend)/.*\.py|Dockerfile[^/]*|examples/disaggregated_prefill_v1/[^/]+\.py"
                   r"|docs/source/conf\.py")


def _sdist_name(project: str, version: str) -> str:
    return f"{project.replace('-', '_')}-{version}.tar.gz"


def sdist_links(project: str) -> dict[str, tuple[str, str]]:
    """Every sdist PyPI lists for `project`: file name -> (URL, the sha256 the index states)."""
    page_url = f"{INDEX}/{project}/"
    with urllib.request.urlopen(page_url, timeout=60) as r:
        page = r.read().decode()
    out = {}
    for href in re.findall(r'href="([^"]+)"', page):
        url, _, frag = href.partition("#")
        name = url.rsplit("/", 1)[-1]
        if name.endswith(".tar.gz"):
            out[name] = (urllib.parse.urljoin(page_url, url), frag.removeprefix("sha256="))
    return out


def sdist(project: str, version: str, sha256: str) -> Path:
    """The sdist's file in the cache, downloaded (and checked against `sha256`) when missing."""
    name = _sdist_name(project, version)
    path = CACHE / "sdist" / name
    if path.is_file():
        return path
    links = sdist_links(project)
    if name not in links:
        raise SystemExit(f"{name} is not listed at {INDEX}/{project}/")
    with urllib.request.urlopen(links[name][0], timeout=600) as r:
        data = r.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise SystemExit(f"{links[name][0]}: sha256 {digest}, pinned {sha256} in tools/release_facts/fetch.py: "
                         "refusing it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path


def source_tree(project: str, version: str, sha256: str) -> Path:
    """The sdist's Python sources, Dockerfiles and docs configuration, extracted once into the cache:
    the directory that holds the package (`<tree>/vllm_ascend/...`)."""
    top = CACHE / "src" / f"{project}-{version}"
    if top.is_dir():
        return top
    archive = sdist(project, version, sha256)
    top.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=top.name + ".", dir=top.parent))
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            for member in tar:
                rel = member.name.split("/", 1)[1] if "/" in member.name else ""
                if not member.isfile() or not _KEEP.fullmatch(rel):
                    continue
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
        staging.rename(top)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return top


def trees(release: str) -> tuple[Path, Path]:
    """(vllm-ascend's tree, vLLM's tree) of a pinned release."""
    pin = PINS.get(release)
    if pin is None:
        raise SystemExit(f"vllm-ascend {release} is not pinned in tools/release_facts/fetch.py (known: "
                         f"{', '.join(PINS)}); `python -m tools.release_facts --pins {release} <its vLLM>` prints the sha256s")
    return (source_tree("vllm-ascend", release, pin.vllm_ascend_sha256),
            source_tree("vllm", pin.vllm, pin.vllm_sha256))


def stated_pins(release: str, vllm: str) -> str:
    """The PINS entry for a release, from the sha256s PyPI's index states (for the operator to check)."""
    ascend = sdist_links("vllm-ascend").get(_sdist_name("vllm-ascend", release))
    core = sdist_links("vllm").get(_sdist_name("vllm", vllm))
    if ascend is None or core is None:
        raise SystemExit(f"PyPI lists no sdist of vllm-ascend {release} or of vllm {vllm}")
    return f'    "{release}": Pin("{ascend[1]}",\n        "{vllm}", "{core[1]}"),'
