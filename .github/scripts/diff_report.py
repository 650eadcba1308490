"""The PR change report: `python -m ascend_pd diff --stack S --base BASE --format markdown` for every
stack, assembled into one markdown document for the PR's sticky comment.

    diff_report.py --base SHA [--head SHA] --out DIR [--python venv/bin/python]

Stacks are discovered (stacks.py): every `Pulumi.<stack>.yaml` of the working tree, plus those
the base has and the PR removes (reported as removed; `diff` cannot render a stack without its
file). Exit codes of `diff`: 0 no change, 10 changes, 2 invalid configuration; anything else, or
no answer within --timeout, is a failure of `diff` itself.

Writes DIR/report.md (what the comment shows: at most COMMENT_BUDGET characters, long sections cut
at a line with their code fences and <details> closed) and DIR/full-report.md, and appends the
full report to $GITHUB_STEP_SUMMARY when it is set. Exits 1 when a stack is invalid or `diff`
failed, so the check goes red; 0 otherwise, changes or not.

Runs in the PR's read-only job (pr.yml `diff`). The comment is posted by post_diff_comment.py.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from stacks import base_stacks, head_stacks

NO_CHANGE, CHANGES, INVALID = 0, 10, 2
# GitHub refuses comments over 65536 characters; the poster adds a header line.
COMMENT_BUDGET = 60_000
SUMMARY_BUDGET = 1_000_000  # $GITHUB_STEP_SUMMARY takes at most 1 MiB per step
ERROR_TAIL_LINES = 60
DEFAULT_TIMEOUT_S = 900
VERDICT_CHARS = 600  # a stack's verdict line in the table at the top


@dataclass(frozen=True)
class Outcome:
    stack: str
    code: int | None  # None: removed from the PR, or `diff` did not answer in time
    stdout: str = ""
    stderr: str = ""
    removed: bool = False

    @property
    def verdict(self) -> str:
        if self.removed:
            return "stack file removed"
        return {NO_CHANGE: "no change", CHANGES: "changes", INVALID: "invalid configuration"}.get(
            self.code, "`diff` failed" + (f" (exit {self.code})" if self.code is not None else " (timed out)"))

    @property
    def headline(self) -> str:
        """The verdict `diff --format markdown` puts on its first line (service, roles, endpoint, a run
        that will fail), for the table at the top of the comment; empty without changes."""
        if self.code != CHANGES:
            return ""
        first = next((line for line in self.stdout.splitlines() if line.strip()), "").strip()
        if first.startswith("**") and first.endswith("**") and first.count("**") == 2:
            first = first[2:-2].strip()  # bold as a line of its own, plain in a table cell
        first = first.replace("|", "\\|")
        return first if len(first) <= VERDICT_CHARS else first[: VERDICT_CHARS - 1] + "…"

    @property
    def failed(self) -> bool:
        return not self.removed and self.code not in (NO_CHANGE, CHANGES)


def run_diff(python: str, stack: str, base: str, project_dir: Path, timeout_s: float) -> Outcome:
    argv = [python, "-m", "ascend_pd", "diff", "--stack", stack, "--base", base, "--format", "markdown"]
    try:
        done = subprocess.run(argv, cwd=project_dir, capture_output=True, text=True, errors="replace",
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return Outcome(stack, None, out, f"no answer within {timeout_s:g} s")
    return Outcome(stack, done.returncode, done.stdout, done.stderr)


def fenced(text: str, lang: str = "text") -> str:
    """A code block that `text` cannot end early, whatever backticks it holds."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text.rstrip()}\n{fence}"


def tail(text: str, lines: int = ERROR_TAIL_LINES) -> str:
    kept = text.rstrip().splitlines()[-lines:]
    return "\n".join(kept)


def section_body(o: Outcome, base: str) -> str:
    if o.removed:
        return (f"`Pulumi.{o.stack}.yaml` exists at the base and not in this PR. Removing the file does not remove "
                f"the deployment: run `pulumi destroy --stack {o.stack}` before (or instead of) deleting it.")
    parts = []
    if o.stdout.strip():
        parts.append(o.stdout.strip())
    if o.failed and o.stderr.strip():
        parts.append("<details><summary>stderr (last lines)</summary>\n\n" + fenced(tail(o.stderr)) + "\n\n</details>")
    if not parts:
        parts.append("(`diff` printed nothing)")
    return "\n\n".join(parts)


def cut(body: str, limit: int, where: str) -> str:
    """`body` cut to at most about `limit` characters at a line boundary, keeping the markdown
    well-formed: an open code fence and open <details> blocks are closed after the cut."""
    if len(body) <= limit:
        return body
    kept: list[str] = []
    size = 0
    for line in body.splitlines():
        if size + len(line) + 1 > limit:
            break
        kept.append(line)
        size += len(line) + 1
    fence = None
    details = 0
    for line in kept:
        m = re.match(r"\s*(`{3,}|~{3,})", line)
        if m:
            mark = m.group(1)
            if fence is None:
                fence = mark
            elif mark[0] == fence[0] and len(mark) >= len(fence) and not line.strip()[len(mark):].strip():
                fence = None
        elif fence is None:
            details += line.count("<details") - line.count("</details>")
    closing = ([fence] if fence else []) + ["</details>"] * max(details, 0)
    return "\n".join(kept + closing + ["", f"*… cut to fit the comment: the whole report is in {where}.*"])


def assemble(outcomes: list[Outcome], base: str, head: str | None, budget: int | None, where: str) -> str:
    short = base[:12]
    lines = ["## ascend-pd change report", ""]
    against = f"the PR's base `{short}`" + (f", head `{head[:12]}`" if head else "")
    if not outcomes:
        return "\n".join(lines + [f"No stack files (`Pulumi.<stack>.yaml`) at {against}."]) + "\n"
    if all(o.code == NO_CHANGE for o in outcomes):
        names = ", ".join(f"`{o.stack}`" for o in outcomes)
        return "\n".join(lines + [f"No change to any stack ({names}), against {against}."]) + "\n"
    lines += [f"`python -m ascend_pd diff` for every stack file, against {against}.", "",
              "| stack | result |", "|---|---|"]
    lines += [f"| `{o.stack}` | {o.verdict}" + (f": {o.headline}" if o.headline else "") + " |" for o in outcomes]
    head_text = "\n".join(lines) + "\n"
    sections = [(f"### `{o.stack}`: {o.verdict}", section_body(o, base)) for o in outcomes]
    if budget is not None:
        room = budget - len(head_text) - sum(len(t) + 4 for t, _ in sections) - 200 * len(sections)
        share = max(room // max(len(sections), 1), 500)
        # Short sections keep everything; what they leave over goes to the long ones.
        small = [b for _, b in sections if len(b) <= share]
        large = [b for _, b in sections if len(b) > share]
        if large:
            share = max((room - sum(len(b) for b in small)) // len(large), 500)
        sections = [(t, cut(b, share, where)) for t, b in sections]
    return head_text + "".join(f"\n{t}\n\n{b}\n" for t, b in sections)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the PR's base commit")
    ap.add_argument("--head", help="the PR's head commit (shown in the report)")
    ap.add_argument("--out", type=Path, required=True, help="directory for report.md and full-report.md")
    ap.add_argument("--python", default="venv/bin/python", help="interpreter with the program's requirements")
    ap.add_argument("--project-dir", type=Path, default=Path.cwd())
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds one stack's diff may take")
    args = ap.parse_args(argv)

    head = head_stacks(args.project_dir)
    removed = [s for s in base_stacks(args.base, args.project_dir) if s not in head]
    outcomes = [run_diff(args.python, s, args.base, args.project_dir, args.timeout) for s in head]
    outcomes += [Outcome(s, None, removed=True) for s in removed]
    outcomes.sort(key=lambda o: o.stack)

    server, repo, run = (os.environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"))
    run_url = f"{server}/{repo}/actions/runs/{run}" if server and repo and run else ""
    where = (f"[the run's summary]({run_url}) and its artifact `ascend-pd-diff` (full-report.md)" if run_url
             else "the run's summary and its artifact `ascend-pd-diff` (full-report.md)")
    args.out.mkdir(parents=True, exist_ok=True)
    full = assemble(outcomes, args.base, args.head, None, where)
    comment = assemble(outcomes, args.base, args.head, COMMENT_BUDGET, where)
    (args.out / "full-report.md").write_text(full, encoding="utf-8")
    (args.out / "report.md").write_text(comment, encoding="utf-8")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as f:
            f.write(full if len(full) <= SUMMARY_BUDGET else assemble(outcomes, args.base, args.head,
                                                                     SUMMARY_BUDGET, "the artifact full-report.md"))
    for o in outcomes:
        print(f"{o.stack}: {o.verdict}")
        if o.failed and o.stderr.strip():
            print(tail(o.stderr, 20), file=sys.stderr)
    return 1 if any(o.failed for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
