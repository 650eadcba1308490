"""Reading a source tree as text and syntax trees, never importing it."""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path


class Unexpected(Exception):
    """The source no longer has the shape a derivation relies on: its facts cannot be trusted."""


@lru_cache(maxsize=None)
def module_ast(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def package_files(tree: Path, package: str) -> list[Path]:
    """The package's Python files, tests left out (they read settings no deployment sets)."""
    return sorted(p for p in (tree / package).rglob("*.py") if "tests" not in p.relative_to(tree).parts)


def module_name(tree: Path, path: Path) -> str:
    parts = list(path.relative_to(tree).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def mentioning(tree: Path, package: str, *words: str) -> list[Path]:
    """The package's files whose text holds any of `words`: the others cannot matter, and parsing
    two thousand files for a handful takes most of a derivation's time."""
    return [p for p in package_files(tree, package) if any(w in p.read_text(encoding="utf-8") for w in words)]


def text(node: ast.AST | None) -> str | None:
    """A string literal's value, else None."""
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def literal(node: ast.AST | None):
    """A literal default (number, text, bool, None) as JSON can hold it; anything else: None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        value = node.operand.value
        return -value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return None


def call_name(node: ast.Call) -> str:
    """`f` of `f(...)` and of `x.y.f(...)`."""
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def find_class(module: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in ast.walk(module) if isinstance(n, ast.ClassDef) and n.name == name), None)


def find_function(node: ast.AST, name: str) -> ast.FunctionDef | None:
    return next((n for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == name), None)
