"""The release's PD proxy script as ascend-pd's launcher meets it: its command-line options (with
their defaults), its HTTP routes, the names it defines at module level (the launcher wraps some of
them: ascend_pd/shell/pd_proxy_launch.py `INTERFACES`), and how it starts uvicorn (with the app
object, or with an import string that makes uvicorn import the script a second time as a module)."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

from .source import Unexpected, call_name, literal, module_ast, text

SCRIPT = "examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py"


def proxy(ascend: Path) -> dict:
    path = ascend / SCRIPT
    module = module_ast(path)
    options: dict[str, object] = {}
    routes: dict[str, str] = {}
    start = None
    for node in ast.walk(module):
        if isinstance(node, ast.Call) and call_name(node) == "add_argument" and (text(node.args[0]) or "").startswith("--"):
            default = next((kw.value for kw in node.keywords if kw.arg == "default"), None)
            options[text(node.args[0])[2:]] = literal(default)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.args and text(dec.args[0]):
                    routes[text(dec.args[0])] = dec.func.attr.upper()
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "uvicorn.run" and node.args:
            start = "object" if isinstance(node.args[0], ast.Name) else "import-string"
    defines = sorted({n.name for n in module.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
                     | {t.id for n in module.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                        for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)})
    if start is None or "host" not in options or "/healthcheck" not in routes:
        raise Unexpected(f"{SCRIPT}: no uvicorn.run(...), --host option or /healthcheck route")
    return {"script": SCRIPT, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "options": dict(sorted(options.items())), "routes": dict(sorted(routes.items())),
            "uvicorn": start, "defines": defines}
