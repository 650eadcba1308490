"""Post the change report of a PR run as ONE sticky comment on its PR (pr-comment.yml).

Runs with a token that may write PR comments, so it trusts nothing that the PR's run produced
except as text to show:
* the PR is found from the event (`workflow_run.head_sha` and `head_repository`) among the open
  PRs, never from the artifact; a run whose commit is no longer the PR's head posts nothing (a
  newer run will);
* the artifact's report.md is read from the zip in memory (nothing is extracted or executed),
  bounded in size, and @mentions in it are defused so a report cannot ping people;
* the comment to update is the one that starts with MARKER and was written by this workflow's
  bot account; any other comment is left alone.

Environment: GH_TOKEN, REPOSITORY, RUN_ID, RUN_URL, HEAD_SHA, HEAD_REPOSITORY. Uses the `gh` CLI
of the runner for the API (auth, pagination, redirects). Standard library only.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import zipfile
from typing import Any, Optional

ARTIFACT = "ascend-pd-diff"
REPORT = "report.md"
MARKER = "<!-- ascend-pd-diff -->"
BOT = "github-actions[bot]"
MAX_REPORT_BYTES = 256 * 1024
MAX_BODY = 65_000  # GitHub's limit is 65536 characters


def gh(*args: str, payload: Optional[dict] = None) -> bytes:
    done = subprocess.run(["gh", "api", *args] + (["--input", "-"] if payload is not None else []),
                          input=json.dumps(payload).encode() if payload is not None else None,
                          capture_output=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"gh api {' '.join(args)} failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def gh_pages(path: str) -> list[Any]:
    """Every item of a paginated list endpoint."""
    pages = json.loads(gh("--paginate", "--slurp", path))
    return [item for page in pages for item in page]


def find_pr(repo: str, head_sha: str, head_repo: str) -> Optional[int]:
    for pr in gh_pages(f"repos/{repo}/pulls?state=open&per_page=100"):
        head = pr.get("head") or {}
        if head.get("sha") == head_sha and ((head.get("repo") or {}).get("full_name") == head_repo):
            return int(pr["number"])
    return None


def read_report(repo: str, run_id: str) -> Optional[str]:
    listing = json.loads(gh(f"repos/{repo}/actions/runs/{run_id}/artifacts?name={ARTIFACT}"))
    found = [a for a in listing.get("artifacts", []) if a.get("name") == ARTIFACT and not a.get("expired")]
    if not found:
        return None
    data = gh(f"repos/{repo}/actions/artifacts/{int(found[0]['id'])}/zip")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z, z.open(REPORT) as f:
            raw = f.read(MAX_REPORT_BYTES + 1)
    except (KeyError, zipfile.BadZipFile):
        return None
    text = raw[:MAX_REPORT_BYTES].decode("utf-8", errors="replace")
    return text if len(raw) <= MAX_REPORT_BYTES else text + "\n\n*… report cut: too large.*\n"


def defuse_mentions(text: str) -> str:
    """`@someone` and `@org/team` do not notify anyone once a zero-width space follows the @."""
    return re.sub(r"(?<![\w`])@(?=[A-Za-z0-9])", "@\u200b", text)


def body_of(report: str, head_sha: str, run_url: str) -> str:
    footer = f"\n\n<sub>Commit {head_sha[:12]} · [workflow run]({run_url}) · updated on every push.</sub>\n"
    text = defuse_mentions(report.strip())
    room = MAX_BODY - len(MARKER) - len(footer) - 1
    if len(text) > room:
        text = text[: room - 40] + "\n\n*… cut to fit the comment.*"
    return f"{MARKER}\n{text}{footer}"


def upsert(repo: str, pr: int, body: str) -> str:
    mine = [c for c in gh_pages(f"repos/{repo}/issues/{pr}/comments?per_page=100")
            if (c.get("user") or {}).get("login") == BOT and (c.get("body") or "").startswith(MARKER)]
    if mine:
        gh("-X", "PATCH", f"repos/{repo}/issues/comments/{int(mine[0]['id'])}", payload={"body": body})
        return f"updated comment {mine[0]['id']} on #{pr}"
    gh("-X", "POST", f"repos/{repo}/issues/{pr}/comments", payload={"body": body})
    return f"created the comment on #{pr}"


def main() -> int:
    env = {k: os.environ.get(k, "") for k in ("REPOSITORY", "RUN_ID", "RUN_URL", "HEAD_SHA", "HEAD_REPOSITORY")}
    missing = [k for k, v in env.items() if not v]
    if missing:
        print(f"missing environment: {missing}", file=sys.stderr)
        return 2
    if not re.fullmatch(r"[0-9]+", env["RUN_ID"]) or not re.fullmatch(r"[0-9a-f]{40}", env["HEAD_SHA"]):
        print("RUN_ID or HEAD_SHA is malformed", file=sys.stderr)
        return 2
    pr = find_pr(env["REPOSITORY"], env["HEAD_SHA"], env["HEAD_REPOSITORY"])
    if pr is None:
        print(f"no open PR has {env['HEAD_REPOSITORY']}@{env['HEAD_SHA'][:12]} as its head (closed, or pushed "
              "again: the newer run posts): nothing to do")
        return 0
    report = read_report(env["REPOSITORY"], env["RUN_ID"])
    if report is None:
        print(f"run {env['RUN_ID']} has no {ARTIFACT} artifact with {REPORT} (the diff job did not get that far)")
        return 0
    print(upsert(env["REPOSITORY"], pr, body_of(report, env["HEAD_SHA"], env["RUN_URL"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
