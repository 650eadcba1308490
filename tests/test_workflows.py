"""The GitHub Actions workflows (.github/workflows) and their scripts (.github/scripts).

The workflows cannot run here (no GitHub), so they are held to what can be checked offline:
actionlint (with shellcheck on every `run:`), zizmor's offline audits, every action pinned by
commit SHA, explicit least-privilege permissions, the fork-PR trust boundary, and the scripts
run for real against a fake `ascend_pd diff` and a fake `gh`.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
SCRIPTS = ROOT / ".github" / "scripts"
BIN = Path(sys.executable).parent
sys.path.insert(0, str(SCRIPTS))

import diff_report  # noqa: E402
import post_diff_comment  # noqa: E402
import stacks  # noqa: E402

PINNED = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+(/[A-Za-z0-9_./-]+)?@[0-9a-f]{40}")


def load(path: Path) -> dict:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if True in doc:  # YAML 1.1 reads the key `on` as true
        doc["on"] = doc.pop(True)
    return doc


def tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is missing from the venv: `venv/bin/pip install -r requirements-dev.txt`")
    return str(path)


def test_there_are_workflows():
    assert {p.name for p in WORKFLOWS} >= {"pr.yml", "pr-comment.yml"}


def test_actionlint():
    assert shutil.which("shellcheck"), "shellcheck must be on PATH: actionlint lints every run: block with it"
    done = subprocess.run([tool("actionlint"), "-no-color", *map(str, WORKFLOWS)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_zizmor_offline():
    """zizmor audits the workflows and the Dependabot config that keeps their pins current."""
    assert (ROOT / ".github" / "dependabot.yml").exists()
    env = {k: v for k, v in os.environ.items() if k not in ("GH_TOKEN", "GITHUB_TOKEN", "ZIZMOR_GITHUB_TOKEN")}
    done = subprocess.run([tool("zizmor"), "--offline", "--persona", "pedantic", "--no-progress", "--color", "never",
                           ".github"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    # An ignore says why, on its own line.
    for path in WORKFLOWS:
        for line in path.read_text(encoding="utf-8").splitlines():
            m = re.search(r"zizmor: ignore\[[a-z-]+\](.*)", line)
            if m:
                assert len(m.group(1).strip()) > 20, f"{path.name}: an ignore without a reason: {line.strip()}"


def test_every_action_is_pinned_by_commit_sha_with_its_version():
    for path in WORKFLOWS:
        text = path.read_text(encoding="utf-8")
        uses = re.findall(r"^\s*(?:-\s+)?uses:\s*(\S+)(.*)$", text, re.M)
        assert uses, path.name
        for ref, rest in uses:
            if ref.startswith("./"):
                continue
            assert PINNED.fullmatch(ref), f"{path.name}: {ref} is not pinned by a full commit SHA"
            assert re.match(r"\s+# v\d+(\.\d+)*\s*$", rest), f"{path.name}: {ref} lacks its version comment (# vX.Y.Z)"
        # Every `uses:` the parser sees is one the regex saw (no flow-style or odd spelling slipped by).
        doc = load(path)
        parsed = [s["uses"] for job in doc["jobs"].values() for s in job.get("steps", []) if "uses" in s]
        parsed += [job["uses"] for job in doc["jobs"].values() if "uses" in job]
        assert sorted(parsed) == sorted(r for r, _ in uses)


def test_permissions_are_explicit_and_least():
    for path in WORKFLOWS:
        doc = load(path)
        assert doc.get("permissions") == {}, f"{path.name}: the workflow must deny everything by default"
        for name, job in doc["jobs"].items():
            perms = job.get("permissions")
            assert isinstance(perms, dict), f"{path.name}:{name}: explicit permissions (a mapping) required"
            assert set(perms.values()) <= {"read", "write", "none"}, (name, perms)
        for line in path.read_text(encoding="utf-8").splitlines():
            if re.match(r"\s+[a-z-]+: (write|read)\b", line) and "permissions" not in line:
                assert "#" in line, f"{path.name}: say why a job needs it: {line.strip()}"


def test_pull_request_jobs_that_can_write_never_run_for_forks():
    """pr.yml runs the PR's code in every job: only jobs limited to this repository's own branches
    (directly or through a job they need) may hold a write permission."""
    doc = load(ROOT / ".github/workflows/pr.yml")
    assert "pull_request_target" not in doc["on"] and "pull_request" in doc["on"]
    same_repo = "github.event.pull_request.head.repo.full_name == github.repository"
    jobs = doc["jobs"]

    def limited(name: str) -> bool:
        job = jobs[name]
        needs = job.get("needs", [])
        needs = [needs] if isinstance(needs, str) else needs
        return same_repo in str(job.get("if", "")) or any(limited(n) for n in needs)

    for name, job in jobs.items():
        if "write" in job["permissions"].values():
            assert limited(name), f"pr.yml:{name} can write but also runs for fork PRs"
    for name, job in jobs.items():
        assert "secrets." not in str(job.get("if", "")), name
        for step in job.get("steps", []):
            assert "secrets." not in str(step.get("if", "")), (name, step)


def test_the_comment_workflow_runs_no_pr_code():
    doc = load(ROOT / ".github/workflows/pr-comment.yml")
    assert set(doc["on"]) == {"workflow_run"} and doc["on"]["workflow_run"]["workflows"] == ["PR"]
    assert load(ROOT / ".github/workflows/pr.yml")["name"] == "PR"
    (job,) = doc["jobs"].values()
    for step in job["steps"]:
        if "uses" in step:
            assert step["uses"].startswith("actions/checkout@")
            assert not {"ref", "repository"} & set(step.get("with", {})), "check out the default branch only"
        else:
            assert step["run"].strip() == "python3 .github/scripts/post_diff_comment.py"
            assert all("workflow_run" in v or v.startswith("${{ github.") for v in step["env"].values())


def test_preview_runs_only_with_its_secrets():
    jobs = load(ROOT / ".github/workflows/pr.yml")["jobs"]
    gate, preview = jobs["preview-setup"], jobs["preview"]
    gate_env = gate["steps"][0]["env"]
    assert {f"HAVE_{s}" for s in ("PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE", "SSH_PRIVATE_KEY",
                                  "SSH_KNOWN_HOSTS")} == set(gate_env)
    assert all(v.endswith("!= '' }}") for v in gate_env.values()), "the gate must see whether, never what"
    assert preview["needs"] == "preview-setup" and "needs.preview-setup.outputs.enabled == 'true'" in preview["if"]
    (action,) = [s for s in preview["steps"] if s.get("uses", "").startswith("pulumi/actions@")]
    assert action["with"]["command"] == "preview" and action["with"]["comment-on-pr"] is True
    assert action["with"]["diff"] is True and "matrix.stack" in action["with"]["stack-name"]
    assert preview["strategy"]["matrix"]["stack"] == "${{ fromJSON(needs.preview-setup.outputs.stacks) }}"


def test_with_the_state_the_change_report_takes_the_engines_steps():
    """The preview job, which has the state, runs `pulumi preview --json` and `diff --preview-json` on it
    after the preview action (which installed the pinned CLI), with the base commit checked out."""
    steps = load(ROOT / ".github/workflows/pr.yml")["jobs"]["preview"]["steps"]
    names = [s.get("name", s.get("uses", "")) for s in steps]
    report = next(s for s in steps if "--preview-json" in s.get("run", ""))
    action = next(i for i, s in enumerate(steps) if s.get("uses", "").startswith("pulumi/actions@"))
    assert steps.index(report) > action, names
    assert 'pulumi preview --json --non-interactive --stack "$STACK_NAME"' in report["run"]
    assert '--base "$BASE_SHA"' in report["run"] and steps[0]["with"]["fetch-depth"] == 0
    assert report["env"]["STACK_NAME"] == next(s for s in steps if s.get("uses", "").startswith(
        "pulumi/actions@"))["with"]["stack-name"]
    # A run of PR code with secrets: nothing from the event reaches the script but through env.
    assert "${{" not in report["run"]


def test_the_change_report_covers_every_stack_file():
    jobs = load(ROOT / ".github/workflows/pr.yml")["jobs"]
    run = " ".join(s.get("run", "") for s in jobs["diff"]["steps"])
    assert ".github/scripts/diff_report.py --base \"$BASE_SHA\"" in run
    assert jobs["diff"]["steps"][0]["with"]["fetch-depth"] == 0
    assert stacks.head_stacks(ROOT) == sorted(p.name[len("Pulumi."):-len(".yaml")] for p in ROOT.glob("Pulumi.*.yaml"))
    assert len(stacks.head_stacks(ROOT)) >= 2


# ---------------------------------------------------------------------------------------------
# diff_report.py against a fake `python -m ascend_pd diff`

FAKE_DIFF = f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
assert args[:3] == ["-m", "ascend_pd", "diff"], args
opts = dict(zip(args[3::2], args[4::2]))
assert opts["--format"] == "markdown" and opts["--base"] == os.environ["EXPECT_BASE"], opts
code, out, err = json.load(open(os.environ["FAKE_DIFF"]))[opts["--stack"]]
sys.stdout.write(out); sys.stderr.write(err); sys.exit(code)
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args):
        return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    for name in ("a2", "a3", "gone"):
        (repo / f"Pulumi.{name}.yaml").write_text("config: {}\n")
    (repo / "Pulumi.yaml").write_text("name: x\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "base")
    base = git("rev-parse", "HEAD")
    (repo / "Pulumi.gone.yaml").unlink()
    (repo / "Pulumi.new.yaml").write_text("config: {}\n")
    fake = tmp_path / "python"
    fake.write_text(FAKE_DIFF)
    fake.chmod(0o755)
    monkeypatch.setenv("EXPECT_BASE", base)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    return repo, base, fake


def report(project, tmp_path, monkeypatch, behaviour: dict) -> tuple[int, str, str]:
    repo, base, fake = project
    behaviour_file = tmp_path / "behaviour.json"
    behaviour_file.write_text(json.dumps(behaviour))
    monkeypatch.setenv("FAKE_DIFF", str(behaviour_file))
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    out = tmp_path / "out"
    code = diff_report.main(["--base", base, "--head", "f" * 40, "--out", str(out), "--python", str(fake),
                             "--project-dir", str(repo)])
    assert summary.read_text() == (out / "full-report.md").read_text()
    return code, (out / "report.md").read_text(), (out / "full-report.md").read_text()


def test_report_of_changes_with_new_and_removed_stacks(project, tmp_path, monkeypatch):
    code, comment, _ = report(project, tmp_path, monkeypatch, {
        "a2": [10, "**2 ranks restart** on `d0`\n\n<details><summary>d0</summary>\n\n```diff\n-a\n+b\n```\n</details>\n", ""],
        "a3": [0, "No change.\n", ""],
        "new": [10, "new stack: everything is created\n", ""],
    })
    assert code == 0  # changes are not a failure
    # A changed stack's row carries its verdict: the first line of `diff --format markdown`, unbolded.
    assert "| `a2` | changes: **2 ranks restart** on `d0` |" in comment and "| `a3` | no change |" in comment
    assert "| `gone` | stack file removed |" in comment and "pulumi destroy --stack gone" in comment
    assert "| `new` | changes: new stack: everything is created |" in comment and "**2 ranks restart** on `d0`" in comment
    assert comment.index("### `a2`") < comment.index("### `a3`") < comment.index("### `gone`") < comment.index("### `new`")


def test_report_of_nothing_is_one_line(project, tmp_path, monkeypatch):
    repo, _, _ = project
    (repo / "Pulumi.new.yaml").unlink()
    (repo / "Pulumi.gone.yaml").write_text("config: {}\n")
    code, comment, _ = report(project, tmp_path, monkeypatch, {s: [0, "No change.\n", ""] for s in ("a2", "a3", "gone")})
    assert code == 0
    body = [line for line in comment.splitlines() if line and not line.startswith("#")]
    assert len(body) == 1 and body[0].startswith("No change to any stack (`a2`, `a3`, `gone`)")


def test_invalid_config_and_a_crash_fail_the_check(project, tmp_path, monkeypatch):
    code, comment, _ = report(project, tmp_path, monkeypatch, {
        "a2": [2, "- `ascend-pd:prefill.tp`: 8 local DP ranks x tp 2 = 16 NPUs. Fix: lower dp.\n", ""],
        "a3": [1, "", "Traceback (most recent call last):\n  ...\nKeyError: 'x'\n```oops```\n"],
        "new": [0, "No change.\n", ""],
    })
    assert code == 1
    assert "| `a2` | invalid configuration |" in comment and "ascend-pd:prefill.tp" in comment
    assert "| `a3` | `diff` failed (exit 1) |" in comment and "KeyError: 'x'" in comment
    assert "````text" in comment  # a fence longer than the backticks in the output


def test_a_huge_report_is_cut_to_fit_a_comment(project, tmp_path, monkeypatch):
    big = "<details><summary>d0</summary>\n\n```diff\n" + "".join(f"+line {i}\n" for i in range(20000))
    code, comment, full = report(project, tmp_path, monkeypatch, {
        "a2": [10, big, ""], "a3": [10, big, ""], "new": [0, "No change.\n", ""]})
    assert code == 0 and len(full) > 200_000
    assert len(comment) <= diff_report.COMMENT_BUDGET
    for section in comment.split("\n### ")[1:3]:
        assert section.count("```") % 2 == 0 and section.count("<details") == section.count("</details>")
        assert "cut to fit the comment" in section
    assert "No change." in comment  # the short section is whole


# ---------------------------------------------------------------------------------------------
# post_diff_comment.py against a fake `gh`

FAKE_GH = f"""#!{sys.executable}
import json, os, sys
state_file = os.environ["FAKE_GH_STATE"]
state = json.load(open(state_file))
args = sys.argv[1:]
assert args[0] == "api", args
method = args[args.index("-X") + 1] if "-X" in args else "GET"
path = [a for a in args[1:] if a.startswith("repos/")][0]
body = json.load(sys.stdin) if "--input" in args else None
state["calls"].append([method, path, body])
json.dump(state, open(state_file, "w"))
if path.endswith("/zip"):
    sys.stdout.buffer.write(bytes.fromhex(state["zip"]))
elif method == "GET":
    answer = state["get"][path.split("?")[0]]
    print(json.dumps([answer] if "--slurp" in args else answer))
"""

HEAD = "a" * 40


def zipped(files: dict[str, str]) -> str:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return buf.getvalue().hex()


@pytest.fixture
def github(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "gh"
    fake.parent.mkdir()
    fake.write_text(FAKE_GH)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    state = tmp_path / "gh.json"
    monkeypatch.setenv("FAKE_GH_STATE", str(state))
    for k, v in {"REPOSITORY": "org/ascend-pd", "RUN_ID": "77", "RUN_URL": "https://github.example/run/77",
                 "HEAD_SHA": HEAD, "HEAD_REPOSITORY": "fork/ascend-pd"}.items():
        monkeypatch.setenv(k, v)

    def run(prs, comments, files=None, artifacts=None):
        state.write_text(json.dumps({
            "calls": [],
            "zip": zipped(files if files is not None else {"report.md": "## report\nping @lead please\n"}),
            "get": {
                "repos/org/ascend-pd/pulls": prs,
                "repos/org/ascend-pd/issues/5/comments": comments,
                "repos/org/ascend-pd/actions/runs/77/artifacts": {"artifacts": artifacts if artifacts is not None else [
                    {"id": 9, "name": "ascend-pd-diff", "expired": False}]},
            },
        }))
        assert post_diff_comment.main() == 0
        return [c for c in json.loads(state.read_text())["calls"] if c[0] != "GET"]

    return run


PR5 = {"number": 5, "head": {"sha": HEAD, "repo": {"full_name": "fork/ascend-pd"}}}


def test_posts_one_comment_then_updates_it(github):
    (write,) = github([PR5], [])
    assert write[:2] == ["POST", "repos/org/ascend-pd/issues/5/comments"]
    body = write[2]["body"]
    assert body.startswith(post_diff_comment.MARKER + "\n## report") and "@\u200blead" in body and HEAD[:12] in body
    others = [{"id": 1, "user": {"login": "someone"}, "body": post_diff_comment.MARKER + " imitation"},
              {"id": 2, "user": {"login": "github-actions[bot]"}, "body": "another bot comment"},
              {"id": 3, "user": {"login": "github-actions[bot]"}, "body": body}]
    (write,) = github([PR5], others)
    assert write[:2] == ["PATCH", "repos/org/ascend-pd/issues/comments/3"]


def test_posts_nothing_for_a_stale_or_unknown_run(github):
    moved = {"number": 5, "head": {"sha": "b" * 40, "repo": {"full_name": "fork/ascend-pd"}}}
    other_fork = {"number": 5, "head": {"sha": HEAD, "repo": {"full_name": "mallory/ascend-pd"}}}
    assert github([moved, other_fork], []) == []
    assert github([PR5], [], artifacts=[]) == []
    assert github([PR5], [], files={"something-else.md": "x"}) == []


def test_the_body_fits_a_comment(github):
    (write,) = github([PR5], [], files={"report.md": "x" * 300_000})
    assert len(write[2]["body"]) <= 65_536


def test_preview_stacks_default_to_every_stack_file(tmp_path):
    for name in ("a2-8node", "a3-4node"):
        (tmp_path / f"Pulumi.{name}.yaml").write_text("config: {}\n")
    (tmp_path / "Pulumi.yaml").write_text("name: x\n")
    assert stacks.preview_stacks(tmp_path, "") == ["a2-8node", "a3-4node"]
    assert stacks.preview_stacks(tmp_path, " a3-4node ") == ["a3-4node"]
    with pytest.raises(SystemExit, match="nope"):
        stacks.preview_stacks(tmp_path, "a2-8node,nope")
