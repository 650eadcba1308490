"""The two sides of a change: the stack file at a base (a git ref, or an old copy of the file) and
the stack file in the working tree, each read into the flat map the Pulumi CLI hands the program.

Only the stack file (and `Pulumi.yaml`'s defaults) comes from the base: the program's code is the
working tree's on both sides, so the report shows what the *configuration* change does with this
code. (Rendering the base with the base's code would need the base's whole program importable
beside this one.)
"""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from ..config import PROJECT, SECRET_KEYS
from ..errors import ConfigError, Problem, Source
from ..loader import located_config_map

GIT_TIMEOUT_S = 60
# What renders the scripts and the graph (a change elsewhere, tests or docs, deploys nothing).
PROGRAM_PATHS = ("ascend_pd/config.py", "ascend_pd/plan.py", "ascend_pd/plan_checks.py", "ascend_pd/loader.py", "ascend_pd/valuetypes.py",
                 "ascend_pd/shell", "ascend_pd/scripts", "ascend_pd/probes.py", "components", "__main__.py")


class SourceError(Exception):
    """The base cannot be read (an unknown ref, no git, an unreadable file): a usage error."""


@dataclass(frozen=True)
class Side:
    label: str  # how the report names this side: "`main` (a1b2c3d4e5f6)", "old.yaml", "working tree"
    config: Optional[dict[str, str]]  # `ascend-pd:<key>` -> string/JSON; None: the stack does not exist there
    problem: Optional[ConfigError] = None  # the file exists but is invalid
    # Program files that differ between the base and the working tree: not rendered at the base.
    code_changes: tuple[str, ...] = ()
    # `ascend-pd:<secret key>` -> a stand-in for its encrypted value (`secure:` in the stack file;
    # `diff` cannot decrypt it): the same ciphertext gives the same stand-in.
    secrets: dict[str, str] = dataclasses.field(default_factory=dict)
    # Where each setting was written (the working tree's file): its problems name the file and line.
    source: Optional[Source] = None


def _git(project_dir: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=project_dir, capture_output=True, timeout=GIT_TIMEOUT_S)
    except FileNotFoundError:
        raise SourceError("--base needs git, which is not installed: use --base-file OLD.yaml") from None
    except subprocess.TimeoutExpired:
        raise SourceError(f"git {' '.join(args)} did not answer within {GIT_TIMEOUT_S} s") from None


def _prefixed(raw: dict[str, str]) -> dict[str, str]:
    return {f"ascend-pd:{k}": v for k, v in raw.items()}


def _secrets(stack: str, directory: Path) -> dict[str, str]:
    """The secret keys the stack file sets (`{secure: CIPHERTEXT}`), each as a stand-in value."""
    try:
        doc = yaml.safe_load((directory / f"Pulumi.{stack}.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return {}
    section = doc.get("config") if isinstance(doc, dict) else None
    out = {}
    for key, value in (section or {}).items() if isinstance(section, dict) else ():
        name = str(key).split(":", 1)[1] if str(key).startswith(f"{PROJECT}:") else None
        if name in SECRET_KEYS and isinstance(value, dict) and set(value) == {"secure"}:
            digest = hashlib.sha256(str(value["secure"]).encode()).hexdigest()[:16]
            out[f"{PROJECT}:{name}"] = f"ascend-pd-diff-secret-{digest}"
    return out


def _read(stack: str, directory: Path, label: str) -> Side:
    try:
        config, source = located_config_map(stack, directory)
        return Side(label, _prefixed(config), secrets=_secrets(stack, directory), source=source)
    except ConfigError as exc:
        return Side(label, {}, exc)


def _copy_project_file(project_dir: Path, into: Path) -> None:
    """The working tree's `Pulumi.yaml` (its config defaults), where there is one: a stack file kept
    outside a Pulumi project (the installed `ascend-pd`) has no defaults beyond the code's."""
    if (project_dir / "Pulumi.yaml").is_file():
        (into / "Pulumi.yaml").write_bytes((project_dir / "Pulumi.yaml").read_bytes())


def working_tree(stack: str, project_dir: Path) -> Side:
    return _read(stack, project_dir, "working tree")


def at_ref(stack: str, ref: str, project_dir: Path) -> Side:
    """`Pulumi.<stack>.yaml` and `Pulumi.yaml` as committed at `ref` (`git show REF:PATH`)."""
    if ref.startswith("-"):
        raise SourceError(f"--base {ref!r}: give a branch, tag or commit, not an option")
    commit = _git(project_dir, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if commit.returncode != 0:
        raise SourceError(f"--base {ref!r} is not a commit of the repository at {project_dir} "
                          "(a shallow clone may lack it: fetch with enough depth, e.g. fetch-depth: 0)")
    sha = commit.stdout.decode().strip()
    label = f"`{ref}` ({sha[:12]})" if not sha.startswith(ref) else f"`{sha[:12]}`"
    code = _git(project_dir, "diff", "--name-only", sha, "--", *PROGRAM_PATHS)
    code_changes = tuple(code.stdout.decode().split()) if code.returncode == 0 else ()
    with tempfile.TemporaryDirectory(prefix="ascend-pd-base-") as tmp:
        found = False
        for name in ("Pulumi.yaml", f"Pulumi.{stack}.yaml"):
            # `./NAME`: relative to the stack's directory, wherever it sits in the repository.
            shown = _git(project_dir, "show", f"{sha}:./{name}")
            if shown.returncode == 0:
                (Path(tmp) / name).write_bytes(shown.stdout)
                found = found or name != "Pulumi.yaml"
            elif name == "Pulumi.yaml":
                # A base without the project file: its defaults are this tree's (if it has one).
                _copy_project_file(project_dir, Path(tmp))
        if not found:
            return Side(label, None, code_changes=code_changes)
        return dataclasses.replace(_read(stack, Path(tmp), label), code_changes=code_changes)


def from_file(stack: str, path: Path, project_dir: Path) -> Side:
    """An old copy of the stack file, with the working tree's `Pulumi.yaml` defaults."""
    if not path.is_file():
        raise SourceError(f"--base-file {path}: no such file")
    with tempfile.TemporaryDirectory(prefix="ascend-pd-base-") as tmp:
        _copy_project_file(project_dir, Path(tmp))
        try:
            (Path(tmp) / f"Pulumi.{stack}.yaml").write_bytes(path.read_bytes())
        except OSError as exc:
            raise SourceError(f"--base-file {path}: {exc.strerror}") from None
        return _read(stack, Path(tmp), f"`{path.name}`")


__all__ = ["Side", "SourceError", "working_tree", "at_ref", "from_file", "Problem"]
