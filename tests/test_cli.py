"""What an operator meets at the command line: options that are refused rather than ignored, exit codes
that say what happened, and no Python traceback for a bad path, Ctrl-C or a closed pipe."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from status_support import clean_env, small_stack, write_stack

from ascend_pd.__main__ import EXIT_CODES

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, cwd: Path = ROOT, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ascend_pd", *args], cwd=cwd, env=clean_env(),
                          capture_output=True, text=True, timeout=timeout, **kw)


def no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr


@pytest.mark.parametrize("command", ["status", "heal"])
def test_count_without_watch_is_refused(command):
    """`--count` only counts the polls of `--watch`: alone it used to be ignored silently."""
    proc = run(command, "--stack", "a2-8node", "--count", "3")
    assert proc.returncode == 2, proc
    assert "--count N needs --watch" in proc.stderr
    no_traceback(proc)


def test_render_out_onto_a_file(tmp_path):
    target = tmp_path / "plan.txt"
    target.write_text("keep me\n")
    proc = run("render", "--stack", "a2-8node", "--out", str(target))
    assert proc.returncode == 2
    assert f"--out {target} exists and is not a directory" in proc.stderr
    assert target.read_text() == "keep me\n"  # nothing written, nothing lost
    assert proc.stdout == ""  # refused before the plan is printed
    no_traceback(proc)


def test_render_out_below_a_file(tmp_path):
    (tmp_path / "f").write_text("")
    proc = run("render", "--stack", "a2-8node", "--out", str(tmp_path / "f" / "scripts"))
    assert proc.returncode == 2
    assert "is not a directory" in proc.stderr
    no_traceback(proc)


def test_render_out_that_cannot_be_created(tmp_path):
    """A path the kernel refuses (here /proc, where no directory can be made): one line, exit 2."""
    proc = run("render", "--stack", "a2-8node", "--out", "/proc/ascend-pd-test/scripts")
    assert proc.returncode == 2
    assert re.search(r"cannot write under /proc/ascend-pd-test/scripts: .+", proc.stderr), proc.stderr
    no_traceback(proc)


def test_closed_pipe_ends_quietly():
    """`... | head -1`: the reader goes away after one line; no BrokenPipeError traceback, exit 141
    (what a shell reports for a writer ended by SIGPIPE)."""
    proc = subprocess.Popen([sys.executable, "-m", "ascend_pd", "docs"], cwd=ROOT, env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert first.strip()
    assert err == "", err


class Tarpit:
    """A TCP listener that accepts and never says a word: an ssh client waits for the banner until
    its deadline, as against a hung node."""

    def __init__(self, host: str) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


def _sigint_default() -> None:
    """SIGINT as a terminal's foreground job has it. tests/run starts pytest as a background job of a
    non-interactive bash, which ignores SIGINT, and an ignored SIGINT is inherited (Python then installs
    no KeyboardInterrupt handler at all): the command would never see the Ctrl-C this test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_doctor(tmp_path):
    """Ctrl-C (SIGINT to the whole foreground group, as a terminal sends it) while doctor waits on a
    node that never answers: one line, exit 130, no KeyboardInterrupt traceback, no ssh left behind."""
    addrs = {"n0": "127.0.3.1", "n1": "127.0.3.2"}
    pits = {n: Tarpit(a) for n, a in addrs.items()}
    try:
        values = small_stack(tmp_path, addrs, prefill=["n0"], decode=["n1"], etcd_node="n0", proxy_node="n0")
        values["ssh"] = {**values.get("ssh", {}), "port": pits["n0"].port}
        write_stack(tmp_path / "proj", "test", values)
        proc = subprocess.Popen(
            [sys.executable, "-m", "ascend_pd", "doctor", "--stack", "test", "--project-dir", str(tmp_path / "proj"),
             "--connect-timeout", "60", "--timeout", "120"],
            cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            preexec_fn=_sigint_default)
        deadline = time.monotonic() + 30
        while not pits["n0"].held and time.monotonic() < deadline:  # doctor's ssh is connected and waiting
            time.sleep(0.05)
        assert pits["n0"].held, "doctor never connected"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, (out, err)
        assert "Traceback" not in err.decode() and "KeyboardInterrupt" not in err.decode(), err.decode()
        assert err.decode().strip().splitlines()[-1].endswith("interrupted")
        time.sleep(0.2)
        left = subprocess.run(["pgrep", "-f", f"ssh.*{addrs['n0']}"], capture_output=True, text=True).stdout
        assert left == "", f"ssh processes left behind: {left}"
    finally:
        for p in pits.values():
            p.close()


def test_exit_codes_are_documented_in_the_readme():
    """One table of exit codes, the same as the code's."""
    readme = (ROOT / "README.md").read_text() + "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    for code in EXIT_CODES:
        assert re.search(rf"^\| `?{code}`? \|", readme, re.M), f"exit code {code} is not in the README's table"


def test_doctor_only_accepts_every_row_name_the_docs_give():
    """`hccn-conf` is a row of the doctor table (the fabric check writes it) and the docs list it as an
    `--only` name: it selects the fabric check instead of being refused."""
    from ascend_pd.__main__ import doctor_checks

    assert doctor_checks(["hccn-conf"]) == (["fabric"], [])
    assert doctor_checks(["hccn-conf", "fabric", "ports"]) == (["fabric", "ports"], [])
    assert doctor_checks(["hccn"]) == (["hccn"], ["hccn"])


def test_installed_command_runs_from_any_directory(tmp_path):
    """`pip install .` gives an `ascend-pd` that works outside the checkout: the package (with its bash
    libraries and the Pulumi program `diff` runs under the mocks) comes from the install, and the stack
    from the current directory."""
    wheels, prefix, work = tmp_path / "wheels", tmp_path / "prefix", tmp_path / "ops"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(wheels), str(ROOT)], check=True, capture_output=True, timeout=300, cwd=tmp_path)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", "--prefix", str(prefix),
                    *map(str, wheels.glob("ascend_pd-*.whl"))], check=True, capture_output=True, timeout=300)
    site = next(prefix.glob("lib/python*/site-packages"))
    work.mkdir()
    for name in ("Pulumi.yaml", "Pulumi.a3-4node.yaml"):
        (work / name).write_text((ROOT / name).read_text())
    env = {**clean_env(), "PYTHONPATH": str(site)}  # the venv's dependencies, this install's ascend_pd
    exe = prefix / "bin" / "ascend-pd"

    where = subprocess.run([sys.executable, "-c", "import ascend_pd; print(ascend_pd.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(site)), where  # not the checkout's copy
    out = work / "scripts"
    proc = subprocess.run([str(exe), "render", "--stack", "a3-4node", "--out", str(out)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("stack a3-4node: 4 nodes")
    launch = next((out / "p0").glob("*-launch.create.sh")).read_text()
    assert "vllm serve" in launch and "group_lib" not in launch.split("\n", 1)[0]  # bash libraries embedded
    (work / "old.yaml").write_text((work / "Pulumi.a3-4node.yaml").read_text())
    (work / "Pulumi.a3-4node.yaml").write_text(
        (work / "Pulumi.a3-4node.yaml").read_text().replace("max-num-seqs: 8", "max-num-seqs: 6", 1))
    proc = subprocess.run([str(exe), "diff", "--stack", "a3-4node", "--base-file", "old.yaml"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 10, proc.stderr  # the Pulumi program ran from the install, under the mocks
    assert "max-num-seqs" in proc.stdout
    proc = subprocess.run([str(exe), "render", "--stack", "nosuch"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and str(work) in proc.stderr  # says where it looked


def test_requirements_and_the_package_agree():
    """requirements.txt (the Pulumi program's venv) and pyproject's dependencies (the command) pin the same."""
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    reqs = [ln.strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()
            if ln.strip() and not ln.startswith("#")]
    assert sorted(deps) == sorted(reqs)


def test_pulumi_sdks_are_pinned_to_the_verified_plugins():
    """A Python SDK asks the engine for the plugin of its own version: a range would let pip take a
    release whose plugin the real-engine suite never ran (pulumi-docker 4.11.2's cannot even be built
    here). The SDKs are pinned exactly, and the venv holds the pinned versions."""
    from importlib.metadata import version

    reqs = dict(ln.split("==", 1) for ln in (ROOT / "requirements.txt").read_text().splitlines()
                if ln.startswith("pulumi") and "==" in ln)
    assert set(reqs) == {"pulumi", "pulumi-command", "pulumi-docker"}
    assert reqs == {name: version(name) for name in reqs}
    # The PR workflow's preview runs the CLI of the same version.
    workflow = (ROOT / ".github" / "workflows" / "pr.yml").read_text()
    assert re.findall(r'pulumi-version: "([^"]+)"', workflow) == [reqs["pulumi"]]


def test_status_verbose_lists_every_component(tmp_path):
    """`status -v` on a dead cluster: every component's problem, where the default folds each
    unreachable node into one line (the folding itself: tests/test_status_down.py)."""
    from status_support import a2_8node_on_loopback

    values = a2_8node_on_loopback(tmp_path, first=60)  # nothing listens on 127.0.2.60-67
    write_stack(tmp_path / "proj", "dead", values)
    base = ["status", "--stack", "dead", "--project-dir", str(tmp_path / "proj"), "--no-smoke", "--timeout", "2"]
    short, full = run(*base), run(*base, "-v")
    assert short.returncode == full.returncode == 1
    folded = re.search(r": 8 PROBLEM\(S\) \((\d+) with -v", short.stdout.splitlines()[0])
    assert folded, short.stdout.splitlines()[0]  # one per node
    n = int(folded.group(1))
    assert n > 40 and full.stdout.splitlines()[0].endswith(f": {n} PROBLEM(S)"), full.stdout.splitlines()[0]


def test_stack_file_anywhere(tmp_path):
    """`--stack-file PATH` reads a stack kept outside the checkout, named after its file; without a
    Pulumi.yaml beside it the code's defaults apply. Neither option, or a missing file: exit 2, one line."""
    elsewhere = tmp_path / "clusters"
    elsewhere.mkdir()
    (elsewhere / "Pulumi.lab.yaml").write_text((ROOT / "Pulumi.a3-4node.yaml").read_text())
    proc = run("render", "--stack-file", str(elsewhere / "Pulumi.lab.yaml"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("stack lab: 4 nodes")
    proc = run("render", cwd=tmp_path)
    assert proc.returncode == 2 and "give --stack NAME or --stack-file PATH" in proc.stderr
    proc = run("status", "--stack-file", str(elsewhere / "Pulumi.nope.yaml"), cwd=tmp_path)
    assert proc.returncode == 2 and "Pulumi.nope.yaml" in proc.stderr
    no_traceback(proc)


def test_render_out_writes_scripts_and_prometheus_files(tmp_path):
    out = tmp_path / "out"
    proc = run("render", "--stack", "a2-8node", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(["d0", "d1", "d2", "d3", "p0", "p1", "p2", "p3", "monitoring"])
    assert (out / "monitoring" / "prometheus.yml").is_file() and (out / "monitoring" / "rules" / "alerts.yml").is_file()
    assert (out / "monitoring" / "grafana-dashboard.json").is_file()
    assert f"Prometheus files and a Grafana dashboard (grafana-dashboard.json) under {out / 'monitoring'}" in proc.stdout
