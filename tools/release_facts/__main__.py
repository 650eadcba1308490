"""Derive what a vllm-ascend release is particular about, from its published sources, into
ascend_pd/data/releases/<release>.json (the checks before a deploy read it: ascend_pd/releases.py).

    venv/bin/python -m tools.release_facts                  every pinned release: write its file
    venv/bin/python -m tools.release_facts 0.23.0.post1     one release
    venv/bin/python -m tools.release_facts --check          exit 1 when a file differs from its derivation
    venv/bin/python -m tools.release_facts --pins 0.24.0 0.24.0   what PyPI states for a new release's PINS

The sources are the sdists pinned in tools/release_facts/fetch.py (downloaded once into
~/.cache/ascend-pd/releases/); they are read as text and syntax trees, never imported.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import fetch
from .additional_config import additional_config
from .connectors import connector_modules, module_path_first, registry, store_backends
from .deprecations import deprecated_values
from .environment import environment
from .images import images
from .proxy import proxy
from .serve_flags import serve_flags

DATA = Path(__file__).resolve().parents[2] / "ascend_pd" / "data" / "releases"
FORMAT = 1  # of the files: ascend_pd/releases.py refuses another


def derive(release: str) -> dict:
    ascend, vllm = fetch.trees(release)
    pin = fetch.PINS[release]
    image_facts, vllm_version = images(ascend)
    if vllm_version != pin.vllm:
        raise SystemExit(f"vllm-ascend {release}'s Dockerfiles build vLLM {vllm_version}, but fetch.PINS pins vLLM "
                         f"{pin.vllm}: pin the sdist of vLLM {vllm_version}")
    connectors = registry(vllm, ascend)
    env, only_in = environment(vllm, ascend, connectors)
    config = additional_config(ascend)
    return {
        "format": FORMAT,
        "regenerate": f"venv/bin/python -m tools.release_facts {release}",
        "release": release,
        "sources": {"vllm-ascend": {"sdist": fetch.sdist("vllm-ascend", release, pin.vllm_ascend_sha256).name,
                                    "sha256": pin.vllm_ascend_sha256},
                    "vllm": {"sdist": fetch.sdist("vllm", pin.vllm, pin.vllm_sha256).name, "sha256": pin.vllm_sha256}},
        "vllm": vllm_version,
        "images": image_facts,
        "serve_flags": serve_flags(vllm),
        "connectors": connectors,
        "module_path_first": module_path_first(vllm),
        "connector_modules": connector_modules(vllm, ascend),
        "store_backends": store_backends(ascend),
        "additional_config": {"keys": config["keys"], "sections": config["sections"]},
        "env": env,
        "env_only_in": only_in,
        "env_moved": config["env_moved"],
        "deprecated_values": deprecated_values(vllm),
        "proxy": proxy(ascend),
    }


def render(facts: dict) -> str:
    return json.dumps(facts, indent=1, sort_keys=False) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.release_facts", description=__doc__.split("\n\n")[0])
    ap.add_argument("releases", nargs="*", help="releases to derive (default: every pinned one)")
    ap.add_argument("--check", action="store_true", help="compare with the files instead of writing them")
    ap.add_argument("--pins", nargs=2, metavar=("RELEASE", "VLLM"), help="print a PINS entry from PyPI's index")
    args = ap.parse_args(argv)
    if args.pins:
        print(fetch.stated_pins(*args.pins))
        return 0
    stale = []
    for release in args.releases or list(fetch.PINS):
        text = render(derive(release))
        path = DATA / f"{release}.json"
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    for path in stale:
        print(f"{path} differs from what its release's sources say: run `venv/bin/python -m tools.release_facts "
              f"{path.stem}`", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
