"""What an endpoint said, made safe to show: control characters escaped, lengths bounded."""

from __future__ import annotations

import json
import re
import unicodedata


# What must not reach a terminal raw: C0/C1 controls and DEL (ANSI escape sequences, CR, BS, BEL),
# format characters (bidi overrides, zero-width), line/paragraph separators, lone surrogates.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NOT_PLAIN_ASCII = re.compile(r"[^ -~]")


def _printable(text: str, keep: str = "") -> str:
    """`text` with every unsafe character (but those in `keep`) written as a Python escape (`\\x1b`)."""

    def escape(m: re.Match) -> str:
        ch = m.group()
        return ch if ch in keep or unicodedata.category(ch) not in _UNSAFE_CATEGORIES else ascii(ch)[1:-1]

    return _NOT_PLAIN_ASCII.sub(escape, text)


def _short(text: str, n: int = 160) -> str:
    """One line of at most n characters, control characters escaped: it is shown to people."""
    text = _printable(" ".join(text.split()))
    return text if len(text) <= n else text[: n - 3] + "..."


def _field(text: str, n: int = 80) -> str:
    """A value from an answer (a name, a URL, a state) as shown: escaped, at most n characters."""
    text = _printable(text)
    return text if len(text) <= n else text[: n - 3] + "..."


def _snippet(obj: object, n: int = 60) -> str:
    """A decoded JSON value, for a message."""
    return _short(json.dumps(obj, default=repr)[: 4 * n], n)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n and not n % (1 << 20) else f"{n}-byte"
