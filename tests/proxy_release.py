#!/usr/bin/env python3
"""The release's PD proxy script, for the integration tests: fetched, never copied into the repo.

vLLM-Ascend ships `examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py` in its
source distribution on PyPI. `setup.sh` runs `python tests/proxy_release.py fetch`: for every release
ascend-pd knows (tools/release_facts/fetch.py `PINS`, sha256-pinned) it takes that one file, unedited,
from the sdist (downloaded once, checked, into ~/.cache/ascend-pd/releases/) and copies it to
~/.cache/ascend-pd/proxy/<version>/. Its sha256 must equal what the release's facts file records
(ascend_pd/data/releases/<version>.json). The tests run it from there with the argv the plan renders
(tests/integration/run_harness.py), picking the release the stack's image runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script (setup.sh): tools/ is beside tests/
    sys.path.insert(0, str(ROOT))

from tools.release_facts.fetch import PINS, source_tree  # noqa: E402

MEMBER = "examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py"
RELEASES = tuple(PINS)
STACK_RELEASE = {"a2-8node": "0.20.2rc1", "a3-4node": "0.18.0"}  # what each committed stack's image runs
SCRIPT_NAME = Path(MEMBER).name
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ascend-pd" / "proxy"
FACTS = ROOT / "ascend_pd" / "data" / "releases"


def script_path(version: str) -> Path:
    return CACHE / version / SCRIPT_NAME


def for_release(version: str) -> Path:
    """The fetched script of a release; a clear error if setup has not run."""
    path = script_path(version)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `bash setup.sh` (or `venv/bin/python tests/proxy_release.py fetch`)")
    return path


def for_stack(stack: str) -> Path:
    return for_release(STACK_RELEASE[stack])


def fetch(version: str) -> Path:
    path = script_path(version)
    if path.is_file():
        return path
    source = source_tree("vllm-ascend", version, PINS[version].vllm_ascend_sha256) / MEMBER
    recorded = json.loads((FACTS / f"{version}.json").read_text(encoding="utf-8"))["proxy"]["sha256"]
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    if digest != recorded:
        raise SystemExit(f"{source}: sha256 {digest}, but {FACTS / version}.json records {recorded}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    shutil.copyfile(source, tmp)
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
