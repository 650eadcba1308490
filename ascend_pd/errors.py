"""One clear error per problem: the setting as written in the stack file, what is wrong, the fix."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from .config import PROJECT


@dataclass(frozen=True)
class Problem:
    setting: str  # as the operator writes it: "ascend-pd:prefill.tp"
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.setting}: {self.message}. Fix: {self.fix}."


class ConfigError(ValueError):
    """Raised before any resource exists; lists every problem found."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid ascend-pd stack configuration ({len(self.problems)} problem(s)):\n{lines}")


def setting(*path: object) -> str:
    """Render a path like ("prefill", "tp") as `ascend-pd:prefill.tp`; list indices as [i]."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return f"{PROJECT}:{out}"


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _fix_for(err: dict) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return "remove it or correct its spelling (see the README's settings table)"
    if kind == "missing":
        return "add it to the stack file"
    if kind.startswith(("int_", "float_", "bool_", "string_", "dict_", "list_")) or kind in (
        "model_type",
        "literal_error",
    ):
        return "write a value of the expected type"
    if kind in ("greater_than_equal", "less_than_equal", "too_short", "too_long", "greater_than", "less_than"):
        return "use a value within the stated bounds"
    if kind == "value_error":
        return "correct the value as the message says"
    return "correct the value"


# Proxy flags the plan derives from the rank layout (ascend-pd:proxy.flags takes only four).
DERIVED_PROXY_FLAGS = ("host", "port", "prefiller-hosts", "prefiller-ports", "decoder-hosts", "decoder-ports")


def from_validation_error(exc: ValidationError) -> ConfigError:
    """Translate pydantic's dump into one Problem per error, naming the setting as written."""
    problems = []
    for err in exc.errors(include_url=False):
        # Union members show up as location parts named after the type (PipStep, str, int, ...):
        # only the first error of a union says what the operator wrote wrong; the types add nothing.
        loc = [p for p in err["loc"] if not (isinstance(p, str) and (p in ("PipStep", "PatchStep") or
                                                                       p.startswith(("function-", "constrained-"))
                                                                       or p in ("str", "int", "float", "bool", "dict",
                                                                                "list", "none")))]
        msg = err["msg"]
        if loc and loc[-1] == "[key]":
            loc = loc[:-1]
            msg = f"bad name: {msg}"
        if err["type"] == "extra_forbidden" and loc[:2] == ["proxy", "flags"] and str(loc[-1]).lstrip("-") in DERIVED_PROXY_FLAGS:
            problems.append(Problem(setting(*loc), "is derived by ascend-pd from the rank layout and proxy.node/port",
                                    "remove it; only max-retries, retry-delay, max-waiting-retries and "
                                    "waiting-retry-interval are tunable"))
            continue
        if err["type"] == "extra_forbidden":
            msg = "unknown setting"
        elif err["type"] == "missing":
            msg = "required setting is missing"
        elif "input" in err and err["type"] not in ("missing",) and not isinstance(err["input"], (dict, list)) \
                and repr(err["input"]) not in msg:
            msg = f"{msg} (got {_shown(err['input'])})"
        problems.append(Problem(setting(*loc), msg, _fix_for(err)))
    return ConfigError(problems)
