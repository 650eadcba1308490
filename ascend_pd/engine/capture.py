"""Run the Pulumi program under the SDK's mocks and record every registration: the resource graph
the engine would receive, without the CLI, a backend or a cluster.

`capture(config, stack=...)` runs the program (`ascend_pd.program.main`, which the checkout's
`__main__.py` calls for the language host) after `set_all_config` with the CLI's flat namespaced
map, against a fresh mock monitor that records each
resource's type, name, URN, parent, provider, dependencies (all, and per input property), options
(delete_before_replace, aliases, custom timeouts) and deserialized inputs. Secret inputs stay
wrapped (`pulumi.runtime.rpc.is_rpc_secret`) as the engine would receive them.

Used by the tests, by the engine model's change scenarios and by `python -m ascend_pd diff`.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

PROJECT_DIR = Path(__file__).resolve().parents[2]
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
    property_dependencies: dict[str, frozenset[str]] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()  # earlier names (name-only aliases)
    custom_timeouts: dict[str, str] = field(default_factory=dict)
    id: str = ""  # the provider's id (the mocks give "<name>-id"; the engine model keeps it across updates)
    # Whether the program set delete_before_replace at all (True or False): unset, the provider decides.
    delete_before_replace_defined: bool = False


@dataclass
class Graph:
    """Every registration of one program run, in registration order."""

    regs: list[Reg]
    error: Optional[BaseException] = None
    warnings: list[str] = field(default_factory=list)  # what the program logged as warnings (pulumi.log.warn)
    _by_urn: dict[str, Reg] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._by_urn = {r.urn: r for r in self.regs}

    def by_urn(self, urn: str) -> Optional[Reg]:
        return self._by_urn.get(urn)

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


def mock_image_id(reference: str) -> str:
    """The image id the mocks give an image: like docker's, the same for the same reference."""
    return "sha256:" + hashlib.sha256(reference.encode()).hexdigest()


@functools.cache  # `plain` asks for it per value: tens of thousands of import statements at 256 nodes
def _pulumi():
    """The SDK, imported late: the plan layer and `render` must not need it."""
    import pulumi
    from pulumi.runtime import Mocks, MockCallArgs, MockResourceArgs, rpc, set_all_config, set_mocks
    from pulumi.runtime import settings
    from pulumi.runtime.mocks import MockMonitor
    from pulumi.runtime.sync_await import _ensure_event_loop

    return pulumi, Mocks, MockCallArgs, MockResourceArgs, rpc, set_all_config, set_mocks, settings, MockMonitor, \
        _ensure_event_loop


class _Collect(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


def capture(config: dict[str, str], *, stack: str, secret_keys: Iterable[str] = (),
            expect_error: bool = False, model: bool = True) -> Graph:
    """Run `__main__.py` with the CLI-style map `config` (`ascend-pd:<key>` -> string/JSON). `model`:
    as `diff` runs it (a secret the stack lacks is a stand-in); False: as `pulumi up` runs it."""
    (pulumi, Mocks, MockCallArgs, MockResourceArgs, rpc, set_all_config, set_mocks, settings, MockMonitor,
     ensure_loop) = _pulumi()

    class _Mocks(Mocks):
        def __init__(self) -> None:
            self.inputs: dict[tuple[str, str], dict] = {}  # (type, name) -> the inputs the monitor deserialized

        def new_resource(self, args: MockResourceArgs):
            self.inputs[args.typ, args.name] = args.inputs
            outs = dict(args.inputs)
            if args.typ == COMMAND:
                # The scripts come back as outputs under the real provider too, but the program reads
                # none of them (a Command's id and stdout only): without them the SDK keeps no second
                # copy of every script (24 MB of a 256-node capture). The Reg keeps the inputs.
                for k in ("create", "update", "delete"):
                    outs.pop(k, None)
            if args.typ == IMAGE:
                # What docker reports: the image's content id, the same for the same reference.
                outs["imageId"] = mock_image_id(str(args.inputs.get("name")))
            return f"{args.name}-id", outs

        def call(self, args: MockCallArgs):
            return {}

    class _Recorder(MockMonitor):
        def __init__(self, mocks: _Mocks) -> None:
            super().__init__(mocks)
            self.regs: list[Reg] = []

        def RegisterResource(self, request):  # noqa: N802 - the gRPC method's name
            resp = super().RegisterResource(request)
            if request.type != "pulumi:pulumi:Stack":
                ensure_loop()
                timeouts = request.customTimeouts
                self.regs.append(Reg(
                    type=request.type,
                    name=request.name,
                    urn=resp.urn,
                    id=resp.id,
                    parent=request.parent,
                    provider=request.provider,
                    dependencies=frozenset(request.dependencies),
                    delete_before_replace=bool(request.deleteBeforeReplace),
                    delete_before_replace_defined=bool(request.deleteBeforeReplaceDefined),
                    replace_on_changes=tuple(request.replaceOnChanges),
                    # As the mock monitor deserialized them for new_resource: a second pass over every
                    # script's text cost a tenth of a 256-node capture.
                    inputs=self.mocks.inputs.pop((request.type, request.name)),
                    custom=bool(request.custom),
                    property_dependencies={k: frozenset(v.urns) for k, v in request.propertyDependencies.items()},
                    aliases=tuple(a.spec.name for a in request.aliases if a.HasField("spec") and a.spec.name),
                    custom_timeouts={k: getattr(timeouts, k) for k in ("create", "update", "delete")
                                     if getattr(timeouts, k)},
                ))
            return resp

    set_all_config(dict(config), secret_keys=list(secret_keys))
    mocks = _Mocks()
    monitor = _Recorder(mocks)
    warnings: list[str] = []
    # The program's log goes to the graph, not to the terminal of the command that captures it (`diff`
    # reports the release warnings itself); under the real engine it is `pulumi preview`'s output.
    logger = logging.getLogger(f"{__name__}.program")
    logger.propagate = False
    logger.handlers[:] = [_Collect(warnings)]
    # A fresh root Stack per run (set_mocks keeps an existing one): URNs carry this run's stack
    # name and stack outputs are this run's only. Internal, as reset_options() does it.
    settings.ROOT.set(None)
    ensure_loop()  # set_mocks registers the root Stack: a caller's asyncio.run() may have left no loop
    set_mocks(mocks, project=PROJECT, stack=stack, preview=False, monitor=monitor, logger=logger)
    error: Optional[BaseException] = None
    # The SDK walks the Python stack at every registration for the engine's source positions (a tenth
    # of a 256-node capture); a Reg keeps none of them, so the mock run skips the walk. The real
    # engine's runs keep it.
    from pulumi.runtime import resource as sdk_resource
    from pulumi.runtime.proto import source_pb2

    from ascend_pd.program import main as program_main, without_full_collections

    stack_trace = sdk_resource._get_stack_trace
    sdk_resource._get_stack_trace = source_pb2.StackTrace
    thresholds = without_full_collections()  # as __main__.py runs it under the engine
    try:  # both put back whatever happens: `diff` and the tests capture in their own process
        pulumi.runtime.test(lambda: program_main(model=model))()
    except Exception as exc:  # noqa: BLE001 - reported to the caller
        if not expect_error:
            raise
        error = exc
    finally:
        sdk_resource._get_stack_trace = stack_trace
        gc.set_threshold(*thresholds)
    if expect_error and error is None:
        raise AssertionError("the program ran without error")
    return Graph(regs=list(monitor.regs), error=error, warnings=warnings)


def stack_output(name: str) -> Any:
    """A stack output as exported by the last run (resolved)."""
    pulumi = _pulumi()[0]
    stack = pulumi.runtime.get_root_resource()
    box: dict[str, Any] = {}
    value = stack.outputs[name]
    pulumi.runtime.test(lambda: pulumi.Output.from_input(value).apply(lambda v: box.setdefault("v", v)))()
    return box["v"]


def unwrap(value: Any) -> Any:
    rpc = _pulumi()[4]
    return rpc.unwrap_rpc_secret(value) if rpc.is_rpc_secret(value) else value


def plain(value: Any) -> Any:
    """`value` with every secret unwrapped, recursively (the engine diffs the plain values)."""
    value = unwrap(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
