"""What a release's images are, from its Dockerfiles: one image per Dockerfile, tagged
`v<release><suffix>` (`Dockerfile` -> no suffix, `Dockerfile.a3` -> `-a3`, `Dockerfile.a3.openEuler` ->
`-a3-openeuler`), built on a CANN base image whose tag names the Python inside
(`quay.io/ascend/cann:9.1.0-a3-ubuntu22.04-py3.12`), with vLLM cloned at `VLLM_TAG`."""

from __future__ import annotations

import re
from pathlib import Path

from .source import Unexpected

_BASE = re.compile(r"^FROM\s+\S+/cann:(?P<cann>[0-9][0-9.]*[0-9])-\S*-py(?P<python>3\.[0-9]+)\s*$", re.M)
_VLLM_TAG = re.compile(r"^ARG\s+VLLM_TAG=\"?v(?P<vllm>[0-9][^\"\s]*)\"?\s*$", re.M)


def suffix_of(dockerfile: str) -> str:
    """The image tag's suffix a Dockerfile's name gives."""
    rest = dockerfile.split(".")[1:]
    return "".join(f"-{part.lower()}" for part in rest)


def images(tree: Path) -> tuple[dict[str, dict[str, str]], str]:
    """({tag suffix: {"dockerfile", "python", "cann"}}, the vLLM release every image builds)."""
    out: dict[str, dict[str, str]] = {}
    vllm: set[str] = set()
    for path in sorted(tree.glob("Dockerfile*")):
        body = path.read_text(encoding="utf-8")
        base, tag = _BASE.search(body), _VLLM_TAG.search(body)
        if base is None or tag is None:
            raise Unexpected(f"{path.name}: no `FROM .../cann:<ver>-...-py3.N` or `ARG VLLM_TAG=v...` line")
        out[suffix_of(path.name)] = {"dockerfile": path.name, "python": base["python"], "cann": base["cann"]}
        vllm.add(tag["vllm"])
    if "" not in out or len(vllm) != 1:
        raise Unexpected(f"{tree}: expected a plain Dockerfile and one VLLM_TAG across them, found "
                         f"{sorted(out)} and {sorted(vllm)}")
    return out, vllm.pop()
