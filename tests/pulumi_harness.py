"""Run the Pulumi program under the SDK's mocks and record every registration.

`run_program(config)` executes `__main__.py` exactly as the language host does (runpy, after
`set_all_config` with the CLI's flat namespaced map) against a fresh MockMonitor that records each
resource's type, name, URN, parent, provider, dependencies, options and deserialized inputs.
Secret inputs stay wrapped (pulumi.runtime.rpc.is_rpc_secret) as the engine would receive them.
"""

from __future__ import annotations

import runpy
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

PROJECT_DIR = Path(__file__).resolve().parent.parent
if str(PROJECT_DIR) not in sys.path:
    sys.path.insert(0, str(PROJECT_DIR))

import pulumi  # noqa: E402
from pulumi.runtime import Mocks, MockCallArgs, MockResourceArgs, set_all_config, set_mocks  # noqa: E402
from pulumi.runtime import rpc  # noqa: E402
from pulumi.runtime import settings as _settings  # noqa: E402
from pulumi.runtime.mocks import MockMonitor  # noqa: E402
from pulumi.runtime.sync_await import _ensure_event_loop  # noqa: E402

from ascend_pd.loader import cli_config_map  # noqa: E402

MAIN = PROJECT_DIR / "__main__.py"
PROJECT = "ascend-pd"

COMMAND = "command:remote:Command"
CONTAINER = "docker:index/container:Container"
IMAGE = "docker:index/remoteImage:RemoteImage"
DOCKER_PROVIDER = "pulumi:providers:docker"


@dataclass
class Reg:
    type: str
    name: str
    urn: str
    parent: str
    provider: str
    dependencies: frozenset[str]
    delete_before_replace: bool
    replace_on_changes: tuple[str, ...]
    inputs: dict[str, Any]
    custom: bool


class _Mocks(Mocks):
    def new_resource(self, args: MockResourceArgs):
        outs = dict(args.inputs)
        if args.typ == IMAGE:
            outs["imageId"] = f"sha256:{args.name}"
        return f"{args.name}-id", outs

    def call(self, args: MockCallArgs):
        return {}


class _Recorder(MockMonitor):
    def __init__(self, mocks: Mocks) -> None:
        super().__init__(mocks)
        self.regs: list[Reg] = []

    def RegisterResource(self, request):
        resp = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            _ensure_event_loop()
            self.regs.append(Reg(
                type=request.type,
                name=request.name,
                urn=resp.urn,
                parent=request.parent,
                provider=request.provider,
                dependencies=frozenset(request.dependencies),
                delete_before_replace=bool(request.deleteBeforeReplace),
                replace_on_changes=tuple(request.replaceOnChanges),
                inputs=rpc.deserialize_properties(request.object),
                custom=bool(request.custom),
            ))
        return resp


@dataclass
class Run:
    regs: list[Reg]
    error: Optional[BaseException] = None
    _by_urn: dict[str, Reg] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._by_urn = {r.urn: r for r in self.regs}

    def of_type(self, typ: str) -> list[Reg]:
        return [r for r in self.regs if r.type == typ]

    def named(self, name: str) -> Reg:
        found = [r for r in self.regs if r.name == name]
        assert len(found) == 1, f"{len(found)} resources named {name!r}"
        return found[0]

    def children(self, parent: Reg, typ: Optional[str] = None) -> list[Reg]:
        return [r for r in self.regs if r.parent == parent.urn and (typ is None or r.type == typ)]

    def ancestors(self, reg: Reg) -> set[str]:
        """URNs `reg` waits for, transitively (dependencies only; parents do not order creation)."""
        seen: set[str] = set()
        todo = list(reg.dependencies)
        while todo:
            urn = todo.pop()
            if urn in seen:
                continue
            seen.add(urn)
            todo.extend(self._by_urn[urn].dependencies if urn in self._by_urn else ())
        return seen

    def waits_for(self, later: Reg, earlier: Reg) -> bool:
        return earlier.urn in self.ancestors(later)


def stack_config(stack: str, overrides: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The flat map the CLI hands the program for `stack`: `ascend-pd:<key>` -> string/JSON."""
    raw = {f"{PROJECT}:{k}": v for k, v in cli_config_map(stack).items()}
    raw.update(overrides or {})
    return raw


def run_program(
    config: dict[str, str],
    *,
    stack: str,
    secret_keys: Iterable[str] = (),
    expect_error: bool = False,
) -> Run:
    set_all_config(dict(config), secret_keys=list(secret_keys))
    mocks = _Mocks()
    monitor = _Recorder(mocks)
    # A fresh root Stack per run (set_mocks keeps an existing one): URNs carry this run's stack
    # name and stack outputs are this run's only. Internal, as reset_options() does it.
    _settings.ROOT.set(None)
    set_mocks(mocks, project=PROJECT, stack=stack, preview=False, monitor=monitor)
    error: Optional[BaseException] = None
    try:
        pulumi.runtime.test(lambda: runpy.run_path(str(MAIN), run_name="__main__"))()
    except Exception as exc:  # noqa: BLE001 - reported to the caller
        if not expect_error:
            raise
        error = exc
    if expect_error and error is None:
        raise AssertionError("the program ran without error")
    return Run(regs=list(monitor.regs), error=error)


def stack_output(name: str) -> Any:
    """A stack output as exported by the last run (resolved)."""
    stack = pulumi.runtime.get_root_resource()
    box: dict[str, Any] = {}
    value = stack.outputs[name]
    pulumi.runtime.test(lambda: pulumi.Output.from_input(value).apply(lambda v: box.setdefault("v", v)))()
    return box["v"]


def unwrap(value: Any) -> Any:
    return rpc.unwrap_rpc_secret(value) if rpc.is_rpc_secret(value) else value
