#!/usr/bin/env python3
"""The release's PD proxy script, for the integration tests: fetched, never copied into the repo.

vLLM-Ascend ships `examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py` in its
source distribution on PyPI. `setup.sh` runs `python tests/proxy_release.py fetch`: for each release a
stack's image runs it downloads that sdist through PyPI's simple index (PEP 503), checks the sha256
pinned below, and extracts that one file, unedited, to ~/.cache/ascend-pd/proxy/<version>/. The tests
run it from there with the argv the plan renders (tests/integration/run_harness.py).

To follow a new image: add its version and the sdist's sha256 (the `#sha256=` of its link on
https://pypi.org/simple/vllm-ascend/), and point the stack's test at it.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import sys
import tarfile
import urllib.parse
import urllib.request
from pathlib import Path

MEMBER = "examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py"
# version -> sha256 of vllm_ascend-<version>.tar.gz; which stack runs it (its image's tag)
RELEASES = {
    "0.20.2rc1": "8ebd5c5b2ef5009baae1c5ddee390a0fe2821ef31aa33312a0b491f5b5185797",  # a2-8node
    "0.18.0": "8df042cfaae06fab993bff5f38bb45097634c3f398b2cf74e068347abdddb344",  # a3-4node
}
STACK_RELEASE = {"a2-8node": "0.20.2rc1", "a3-4node": "0.18.0"}
SCRIPT_NAME = Path(MEMBER).name
INDEX = os.environ.get("ASCEND_PD_PYPI_SIMPLE", "https://pypi.org/simple").rstrip("/")
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ascend-pd" / "proxy"


def script_path(version: str) -> Path:
    return CACHE / version / Path(MEMBER).name


def for_stack(stack: str) -> Path:
    """The fetched script of the release `stack`'s image runs; a clear error if setup has not run."""
    path = script_path(STACK_RELEASE[stack])
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `bash setup.sh` (or `venv/bin/python tests/proxy_release.py fetch`)")
    return path


def _sdist_url(version: str) -> str:
    name = f"vllm_ascend-{version}.tar.gz"
    with urllib.request.urlopen(f"{INDEX}/vllm-ascend/", timeout=60) as r:
        page = r.read().decode()
    for href in re.findall(r'href="([^"]+)"', page):
        if href.split("#")[0].endswith("/" + name) or href.split("#")[0] == name:
            return urllib.parse.urljoin(f"{INDEX}/vllm-ascend/", href.split("#")[0])
    raise SystemExit(f"{name} is not listed at {INDEX}/vllm-ascend/")


def fetch(version: str) -> Path:
    path = script_path(version)
    if path.is_file():
        return path
    url = _sdist_url(version)
    with urllib.request.urlopen(url, timeout=300) as r:
        data = r.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != RELEASES[version]:
        raise SystemExit(f"{url}: sha256 {digest}, pinned {RELEASES[version]} in tests/proxy_release.py: refusing it")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        member = next((m for m in tar.getmembers() if m.isfile() and m.name.split("/", 1)[-1] == MEMBER), None)
        if member is None:
            raise SystemExit(f"{url} has no {MEMBER}")
        text = tar.extractfile(member).read()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(text)
    tmp.replace(path)
    return path


def main(argv: list[str]) -> int:
    if argv[1:] != ["fetch"]:
        print("usage: proxy_release.py fetch", file=sys.stderr)
        return 2
    for version in RELEASES:
        print(f"PD proxy of vllm-ascend {version}: {fetch(version)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
