"""Every rank's command held to the vllm-ascend release that runs it, before anything deploys.

What a release is particular about is data, derived from its published sources by
`venv/bin/python -m tools.release_facts` into `data/releases/<release>.json`: the vLLM it runs on,
its images' Python, the `vllm serve` flags, the KV connector registry and the connector modules,
whether vLLM imports an explicit module path before the registry, the `additional-config` keys it
reads and where, the environment variables it reads, deprecated values, its PD proxy's interface.

A stack's release comes from each image's tag (`quay.io/ascend/vllm-ascend:v0.20.2rc1`, `...:v0.18.0-a3`),
or from `vllmAscend.release` when the tag does not say. `check` returns (errors, warnings): errors
would break a rank or the proxy, or lose a setting; warnings are settings that do nothing
(`vllmAscend.strict` makes them errors). Each problem names the setting, the release and the fix.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Optional

from .config import KV_POOL_BACKEND, PROJECT, StackConfig, node_image
from .errors import Problem, did_you_mean, setting

RELEASES_DIR = Path(__file__).resolve().parent / "data" / "releases"
FORMAT = 1
REGENERATE = "venv/bin/python -m tools.release_facts"
ADD_RELEASE = ("pin its sdists in tools/release_facts/fetch.py (`venv/bin/python -m tools.release_facts --pins "
               "RELEASE VLLM` prints what PyPI states) and run `venv/bin/python -m tools.release_facts RELEASE` "
               "(docs/reference.md, \"Release checks\")")
# The connectors every rank's kv-transfer-config names besides the role's Mooncake connector.
PROGRAM_CONNECTORS = ("MultiConnector", "AscendStoreConnector")
_TAG = re.compile(r"v?(?P<release>[0-9]+\.[0-9]+\.[0-9]+(?:rc[0-9]+)?(?:\.post[0-9]+)?)(?P<suffix>(?:-[a-z0-9]+)*)")
_VERSION = re.compile(r"([0-9]+)\.([0-9]+)\.([0-9]+)(?:rc([0-9]+))?(?:\.post([0-9]+))?")
_WHEEL_PY = re.compile(r"-cp(?P<major>[0-9])(?P<minor>[0-9]+)-[^-]+-[^-]+\.whl$")


def version_key(release: str) -> tuple:
    """Order of releases: 0.20.2rc1 < 0.20.2 < 0.20.2.post1."""
    m = _VERSION.fullmatch(release)
    a, b, c, rc, post = m.groups() if m else ("0", "0", "0", None, None)
    return int(a), int(b), int(c), (0, int(rc)) if rc else (1, 0), int(post or 0)


@dataclass(frozen=True)
class Release:
    """One release's facts (data/releases/<name>.json)."""

    name: str
    facts: dict

    @property
    def vllm(self) -> str:
        return self.facts["vllm"]

    @property
    def label(self) -> str:
        return f"vllm-ascend {self.name} (vLLM {self.vllm})"

    def python_of(self, suffix: str) -> str:
        """The Python of the release's image with this tag suffix; a suffix of no Dockerfile of the
        release (a private rebuild, `v0.20.2rc1-site`) is taken to be built on its plain image."""
        images = self.facts["images"]
        return (images.get(suffix) or images[""])["python"]

    def env_reader(self, name: str) -> Optional[list[str]]:
        """None: read by the release's own code; a list: read only inside those connectors ([]: nowhere)."""
        return self.facts["env_only_in"].get(name)

    def section_of(self, key: str) -> list[str]:
        """The additional-config sections that read `key` inside them."""
        return [s for s, keys in self.facts["additional_config"]["sections"].items() if key in keys]


def known() -> list[str]:
    return sorted((p.stem for p in RELEASES_DIR.glob("*.json")), key=version_key)


@lru_cache(maxsize=None)
def load(name: str) -> Release:
    facts = json.loads((RELEASES_DIR / f"{name}.json").read_text(encoding="utf-8"))
    if facts.get("format") != FORMAT:
        raise ValueError(f"{RELEASES_DIR / name}.json is of format {facts.get('format')}, not {FORMAT}: "
                         f"run `{REGENERATE} {name}`")
    return Release(name, facts)


@lru_cache(maxsize=1)
def all_serve_flags() -> frozenset[str]:
    """Every flag some known release's `vllm serve` accepts (the loader's early spelling check)."""
    return frozenset(f for name in known() for f in load(name).facts["serve_flags"])


def vllm_versions() -> str:
    """`vLLM 0.18.0, 0.20.2 and 0.23.0`: whose flags all_serve_flags holds."""
    versions = sorted({load(n).vllm for n in known()}, key=version_key)
    return "vLLM " + (", ".join(versions[:-1]) + " and " + versions[-1] if len(versions) > 1 else versions[0])


# ---------------------------------------------------------------------------------------------
# Which release an image runs


@dataclass(frozen=True)
class ImageRelease:
    image: str
    where: str  # the setting that names the image
    release: Optional[Release]
    suffix: str  # the tag's variant suffix (`-a3`), which picks the Dockerfile and its Python


def _tag(image: str) -> str:
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else ""


def release_named(image: str, explicit: Optional[str] = None) -> Optional[str]:
    """The release `image`'s tag names, else `explicit` (vllmAscend.release); None when neither does."""
    tag = _TAG.fullmatch(_tag(image))
    return tag["release"] if tag else explicit


def image_release(cfg: StackConfig, image: str, where: str, problems: list[Problem]) -> ImageRelease:
    """The release `image` runs, from its tag or vllmAscend.release; a problem when neither names a
    known release, or the two disagree."""
    tag = _TAG.fullmatch(_tag(image))
    named = cfg.vllm_ascend.release
    names = known()
    listed = ", ".join(names)
    if tag and named and tag["release"] != named:
        problems.append(Problem(setting("vllmAscend", "release"), f"is {named}, but the tag of {where.split(':', 1)[1]} "
                                f"({image}) names {tag['release']}", "make the two agree, or remove vllmAscend.release"))
        return ImageRelease(image, where, None, "")
    release = tag["release"] if tag else named
    if release is None:
        problems.append(Problem(where, f"the tag of {image} names no vllm-ascend release", (
            f"set `{PROJECT}:vllmAscend.release` to the release it runs (known: {listed})")))
        return ImageRelease(image, where, None, "")
    if release not in names:
        near = did_you_mean(release, names)
        problems.append(Problem(where if tag else setting("vllmAscend", "release"),
                                f"vllm-ascend {release} is not a release ascend-pd knows (known: {listed})",
                                (f"did you mean {near}? To add {release}, " if near else f"To add {release}, ")
                                + ADD_RELEASE))
        return ImageRelease(image, where, None, "")
    return ImageRelease(image, where, load(release), tag["suffix"] if tag else "")


# ---------------------------------------------------------------------------------------------
# The checks


@dataclass
class _Findings:
    errors: list[Problem]
    warnings: list[Problem]

    def add(self, problem: Problem, *, error: bool) -> None:
        bucket = self.errors if error else self.warnings
        if all((p.setting, p.message) != (problem.setting, problem.message) for p in self.errors + self.warnings):
            bucket.append(problem)


def _source(cfg: StackConfig, role: str, field: str, key: str) -> str:
    """Which map a role's merged flag or env key comes from: the role's own, else `vllm.`."""
    return role if key in getattr(getattr(cfg, role), field) else "vllm"


def _connector_problems(f: _Findings, cfg: StackConfig, role: str, rel: Release) -> None:
    r = getattr(cfg, role)
    registry, modules = rel.facts["connectors"], rel.facts["connector_modules"]
    for name in PROGRAM_CONNECTORS:
        if name not in registry:
            f.add(Problem(setting(role, "image") if r.image else setting("container", "image"),
                          f"{rel.label} registers no {name}, which every rank's kv-transfer-config names",
                          "run a release that has it"), error=True)
    steps = [(i, s.repo) for i, s in enumerate(cfg.container.prepare) if getattr(s, "repo", None)]
    patched = [i for i, repo in steps if repo.rstrip("/").endswith("vllm-ascend")]
    # The step that carries the backend's patches (their file names say so), on some other repository.
    steps = [(i, repo) for i, repo in steps
             if any(KV_POOL_BACKEND in p.rsplit("/", 1)[-1].lower() for p in cfg.container.prepare[i].patches)]
    if KV_POOL_BACKEND not in rel.facts["store_backends"] and not patched:
        missing = (f"{rel.label} has no {KV_POOL_BACKEND!r} backend for AscendStoreConnector (it has "
                   f"{', '.join(rel.facts['store_backends'])}): every rank would fail at start")
        if steps:  # the backend's patches are there, but on no vllm-ascend checkout: that repo is what to fix
            i, repo = steps[-1]
            f.add(Problem(setting("container", "prepare", i, "repo"),
                          f"{repo!r} is not the image's vllm-ascend repository (its path ends in vllm-ascend), and no "
                          f"other step patches one; {missing}",
                          "point the step with the yuanrong backend patches at the image's vllm-ascend checkout "
                          "(e.g. /vllm-workspace/vllm-ascend), or run vllm-ascend 0.20.2rc1 or later"), error=True)
        else:
            f.add(Problem(setting(role, "image") if r.image else setting("container", "image"), missing,
                          "run vllm-ascend 0.20.2rc1 or later, or patch the backend in with a container.prepare step "
                          "on the image's vllm-ascend repository (seed 003's patch series)"), error=True)
    path = r.connector_module_path
    if path is None:
        if r.connector not in registry:
            near = did_you_mean(r.connector, sorted(registry))
            f.add(Problem(setting(role, "connector"), f"{rel.label} registers no KV connector {r.connector!r}",
                          (f"did you mean '{near}'? " if near else "") + "use one of "
                          + ", ".join(sorted(n for n in registry if "ooncake" in n))
                          + ", or set connectorModulePath to the module that defines it"), error=True)
        return
    registered = registry.get(r.connector)
    order = ("imports a kv_connector_module_path before it looks at its registry, so every "
             f"{role} rank would fail at start") if rel.facts["module_path_first"] else \
        "looks at its registry first, so the path is unused today and fatal from vLLM 0.20 on"
    fix = (f"remove {role}.connectorModulePath: {rel.label} registers {r.connector} itself "
           f"({registered['module']})") if registered else \
        f"point connectorModulePath at the module that defines class {r.connector}"
    known_tree = any(path == t or path.startswith(t + ".") for t in ("vllm_ascend.distributed", "vllm.distributed"))
    if path in modules:
        if r.connector not in modules[path]:
            f.add(Problem(setting(role, "connectorModulePath"),
                          f"{path} in {rel.label} defines no class {r.connector} (it defines "
                          f"{', '.join(modules[path]) or 'none'}); vLLM {rel.vllm} {order}", fix),
                  error=rel.facts["module_path_first"] or registered is None)
    elif known_tree:
        f.add(Problem(setting(role, "connectorModulePath"),
                      f"{path}: no such module in {rel.label}, whose connectors live under "
                      "vllm_ascend.distributed.kv_transfer.kv_p2p and kv_pool; vLLM "
                      f"{rel.vllm} {order} (ModuleNotFoundError)", fix), error=True)


def _flag_problems(f: _Findings, cfg: StackConfig, role: str, rel: Release) -> None:
    allowed = {a.replace("_", "-") for a in cfg.vllm.allow_unknown_flags}
    known_flags = set(rel.facts["serve_flags"])
    everywhere = all_serve_flags()
    merged = {**cfg.vllm.flags, **getattr(cfg, role).flags}
    for key in merged:
        # A flag no release knows is the loader's (with did-you-mean); here: known elsewhere, not here.
        if key not in known_flags and key in everywhere and key not in allowed:
            others = [n for n in known() if key in load(n).facts["serve_flags"]]
            f.add(Problem(setting(_source(cfg, role, "flags", key), "flags", key),
                          f"is not a flag of `vllm serve` in {rel.label} (it is in vllm-ascend {', '.join(others)})",
                          f"remove it, or allow it with `{PROJECT}:vllm.allowUnknownFlags: [{key}]`"), error=True)


def _additional_config_problems(f: _Findings, cfg: StackConfig, role: str, rel: Release, strict: bool) -> None:
    merged = {**cfg.vllm.flags, **getattr(cfg, role).flags}
    extra = merged.get("additional-config")
    if not isinstance(extra, dict):
        return
    src = _source(cfg, role, "flags", "additional-config")
    facts = rel.facts["additional_config"]
    top, sections = facts["keys"], facts["sections"]

    def where(*path: str) -> str:
        return setting(src, "flags", "additional-config", *path)

    for key, value in extra.items():
        if key in sections and isinstance(value, dict):
            for sub in value:
                if sub in sections[key]:
                    continue
                if sub in top:
                    f.add(Problem(where(key, sub), f"{rel.label} reads {sub} at the top of additional-config, "
                                  f"not inside {key}: here it does nothing", f"move it up, beside {key}"), error=strict)
                else:
                    f.add(Problem(where(key, sub), f"{rel.label} does not read {sub} inside {key} (it reads "
                                  f"{', '.join(sections[key])}): it does nothing", "remove it"), error=strict)
            continue
        if key in top:
            continue
        inside = rel.section_of(key)
        if inside:
            f.add(Problem(where(key), f"{rel.label} reads {key} inside additional-config."
                          f"{inside[0]}, not at the top level: here it does nothing",
                          f"move it into additional-config: {{{inside[0]}: {{{key}: ...}}}}"), error=strict)
            continue
        _gone(f, where(key), key, value, rel, strict, kind="additional-config key")


def _last_reader(key: str, rel: Release, kind: str) -> tuple[Optional[Release], object]:
    """The newest earlier release that read `key`, and its default there."""
    for name in reversed(known()):
        other = load(name)
        if version_key(name) >= version_key(rel.name):
            continue
        if kind == "env" and key in other.facts["env"] and other.env_reader(key) != []:
            return other, other.facts["env"][key]
        if kind != "env" and key in other.facts["additional_config"]["keys"]:
            return other, other.facts["additional_config"]["keys"][key]
    return None, None


def _changes_behaviour(value: object, default: object) -> bool:
    if default is None:
        return False  # no literal default known: the release notes say what the value did
    norm = (lambda v: str(v).strip().lower() if not isinstance(v, bool) else str(int(v)))
    return norm(value) != norm(default) and {norm(value), norm(default)} not in ({"true", "1"}, {"false", "0"})


def _gone(f: _Findings, where: str, key: str, value: object, rel: Release, strict: bool, *, kind: str,
          replacement: str = "") -> None:
    """A key or variable this release does not read: removed (read by an earlier release) or unknown."""
    last, default = _last_reader(key, rel, "env" if kind == "environment variable" else "config")
    instead = f"set {replacement} instead" if replacement else "remove it"
    if last is not None:
        lost = _changes_behaviour(value, default)
        f.add(Problem(where, f"{rel.label} no longer reads {kind} {key} (vllm-ascend {last.name} did, default "
                      f"{default!r})" + (f": your value {value!r} would be lost" if lost else ": it does nothing"),
                      instead), error=lost or strict)
    else:
        f.add(Problem(where, f"{rel.label} does not read {kind} {key}: it does nothing", instead), error=strict)


def _env_problems(f: _Findings, cfg: StackConfig, role: str, rel: Release, strict: bool) -> None:
    merged = {**cfg.vllm.env, **getattr(cfg, role).env}
    r = getattr(cfg, role)
    in_use = {"MultiConnector", "AscendStoreConnector", r.connector}
    env, moved = rel.facts["env"], rel.facts["env_moved"]
    for name, value in merged.items():
        where = setting(_source(cfg, role, "env", name), "env", name)
        if name in env:
            readers = rel.env_reader(name)
            if name in moved:
                f.add(Problem(where, f"{rel.label} reads {name} only as a deprecated fallback of additional-config "
                              f"key {moved[name]}", f"set `additional-config: {{{moved[name]}: ...}}` in "
                              f"{role}.flags instead"), error=strict)
            elif readers == [] and name.startswith("VLLM"):
                f.add(Problem(where, f"{rel.label} registers {name} but nothing reads it: it does nothing",
                              "remove it"), error=strict)
            elif readers and not in_use & set(readers):
                f.add(Problem(where, f"in {rel.label} only {', '.join(readers)} read(s) {name}, and this stack "
                              f"runs {r.connector}: it does nothing", "remove it"), error=strict)
            continue
        earlier_key = next((other.facts["env_moved"][name] for other in map(load, known())
                            if name in other.facts["env_moved"]), None)
        if earlier_key and earlier_key in rel.facts["additional_config"]["keys"]:
            _gone(f, where, name, value, rel, strict, kind="environment variable",
                  replacement=f"`additional-config: {{{earlier_key}: ...}}` in {role}.flags")
        elif name.startswith("VLLM_") or _last_reader(name, rel, "env")[0] is not None:
            # vLLM's namespace (vLLM itself warns of an unknown VLLM_ variable), or one an earlier release read.
            # Others (HCCL_*, ASCEND_*, ...) are read by native libraries these facts cannot see.
            _gone(f, where, name, value, rel, strict, kind="environment variable")


def _deprecation_problems(f: _Findings, cfg: StackConfig, role: str, rel: Release, strict: bool) -> None:
    merged = {**cfg.vllm.flags, **getattr(cfg, role).flags}
    for flag, keys in rel.facts["deprecated_values"].items():
        value = merged.get(flag)
        if not isinstance(value, dict):
            continue
        for key, table in keys.items():
            old = value.get(key)
            if isinstance(old, str) and old in table:
                f.add(Problem(setting(_source(cfg, role, "flags", flag), "flags", flag, key),
                              f"{old!r} is deprecated in {rel.label}: every rank warns and uses {table[old]!r}",
                              f"write {key}: {table[old]}"), error=strict)


def _wheel_problems(f: _Findings, cfg: StackConfig, images: list[ImageRelease]) -> None:
    wheel = _WHEEL_PY.search(cfg.yuanrong.package)
    if wheel is None:
        return  # a requirement (`openyuanrong-datasystem==0.8.1`): pip picks the wheel for the image's Python
    tag = f"{wheel['major']}.{wheel['minor']}"
    for img in images:
        python = img.release.python_of(img.suffix)
        if python != tag:
            f.add(Problem(setting("yuanrong", "package"), f"is a wheel for Python {tag} (cp{tag.replace('.', '')}), "
                          f"but {img.image} runs Python {python} ({img.release.label}): pip cannot install it",
                          f"use the wheel built for cp{python.replace('.', '')}, or a requirement such as "
                          "`openyuanrong-datasystem==0.8.1` that pip resolves for the image"), error=True)


def _proxy_problems(f: _Findings, cfg: StackConfig, img: ImageRelease) -> None:
    from .shell.pd_proxy_launch import interface_of  # the launcher's own table of what it wraps

    rel = img.release
    facts = rel.facts["proxy"]
    flags = cfg.proxy.flags.model_dump(by_alias=True, exclude_none=True)
    for key in flags:
        if key not in facts["options"]:
            f.add(Problem(setting("proxy", "flags", key), f"the PD proxy of {rel.label} has no --{key}",
                          "remove it"), error=True)
    if cfg.proxy.keep_removed_out and interface_of(facts["defines"]) is None:
        f.add(Problem(setting("proxy", "keepRemovedOut"), f"pd_proxy_launch.py knows no interface of the PD proxy "
                      f"of {rel.label}: it cannot keep removed instances out", "set proxy.keepRemovedOut to false, "
                      "or teach ascend_pd/shell/pd_proxy_launch.py the release's proxy"), error=True)


def _node_images(cfg: StackConfig) -> Iterator[tuple[str, str]]:
    """(image, the setting that names it) of every node's container."""
    yield cfg.container.image, setting("container", "image")
    for role in ("prefill", "decode"):
        image = getattr(cfg, role).image
        if image:
            yield image, setting(role, "image")


def check(cfg: StackConfig) -> tuple[list[Problem], list[Problem]]:
    """(errors, warnings) of the stack against the releases its images run."""
    f = _Findings([], [])
    strict = cfg.vllm_ascend.strict
    by_image = {image: image_release(cfg, image, where, f.errors) for image, where in _node_images(cfg)}
    if f.errors:
        return f.errors, []
    for role in ("prefill", "decode"):
        rel = by_image[getattr(cfg, role).image or cfg.container.image].release
        _connector_problems(f, cfg, role, rel)
        _flag_problems(f, cfg, role, rel)
        _additional_config_problems(f, cfg, role, rel, strict)
        _env_problems(f, cfg, role, rel, strict)
        _deprecation_problems(f, cfg, role, rel, strict)
    used = {node_image(cfg, [r for r in ("prefill", "decode") if n.name in getattr(cfg, r).nodes]) for n in cfg.nodes}
    _wheel_problems(f, cfg, [by_image[i] for i in sorted(used)])
    proxy_roles = [r for r in ("prefill", "decode") if cfg.proxy.node in getattr(cfg, r).nodes]
    _proxy_problems(f, cfg, by_image[node_image(cfg, proxy_roles)])
    return f.errors, f.warnings
