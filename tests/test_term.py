"""ascend_pd/term.py and the commands that draw with it: plain text when the stream is not a
terminal (what pipes, CI logs and scripts read), rich on a terminal, NO_COLOR honoured, and no
value ever read as rich markup."""

from __future__ import annotations

import io
import re
import subprocess
import sys

from ascend_pd import term
from ascend_pd.loader import PROJECT_DIR, load_stack
from ascend_pd.plan import build_plan
from ascend_pd.render import summary, summary_blocks

COLOUR = re.compile(r"\x1b\[[0-9;]*(3[0-7]|9[0-7])(;[0-9]+)*m")  # a foreground colour code
ESC = "\x1b"
TABLE = term.Table(("COMPONENT", "STATE"), [("etcd", "ok"), ("proxy", "FAIL"), ("[bold]x[/bold]", "[red]y")])


def test_plain_when_not_a_terminal():
    out = io.StringIO()
    term.write(["title", TABLE], out)
    assert ESC not in out.getvalue()
    assert out.getvalue().splitlines() == ["title", "COMPONENT       STATE", "etcd            ok",
                                           "proxy           FAIL", "[bold]x[/bold]  [red]y"]
    with term.progress("polling", io.StringIO()) as update:
        update(1, 2)
    with term.phases(io.StringIO()) as say:
        say("working")


def test_a_terminal_gets_rich_tables_in_colour(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = io.StringIO()
    term.write(["title", TABLE], out, force_terminal=True)
    text = out.getvalue()
    assert "─" in text and COLOUR.search(text)  # rich's rule under the head; FAIL in red
    # Values are shown as written, never as markup.
    assert "[bold]x[/bold]" in text and "[red]y" in text


def test_no_color_is_honoured(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    out = io.StringIO()
    term.write([TABLE], out, force_terminal=True)
    assert "─" in out.getvalue() and not COLOUR.search(out.getvalue())


def test_progress_on_a_terminal_is_transient():
    err = io.StringIO()
    with term.progress("polling", err, force_terminal=True) as update:
        update(2, 5)
    assert "polling" in err.getvalue() and err.getvalue().endswith("\x1b[2K")


def test_render_is_plain_through_a_pipe_and_rich_on_a_terminal():
    plan = build_plan(load_stack("a3-4node"), "a3-4node")
    piped = subprocess.run([sys.executable, "-m", "ascend_pd", "render", "--stack", "a3-4node"], cwd=PROJECT_DIR,
                           capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stdout == summary(plan) + "\n" and ESC not in piped.stdout
    out = io.StringIO()
    term.write(summary_blocks(plan), out, force_terminal=True)
    assert ESC in out.getvalue() and "prefill-0" in out.getvalue()
