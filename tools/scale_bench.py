"""Scale benchmark (issue 40): how `render`, `diff`, `preview` and the day-2 commands grow with the
stack. Not a test: it prints a table, to be rerun before and after a change that claims to make them
faster.

The stacks are generated from the committed a2-8node stack (its profile, flags and layout rules),
with N nodes: half prefill (one-node instances, DP2/TP4: N/2 instances), half decode (4-node
instances, DP32: N/8 instances), every node's host key pinned, the nodes on 127.1.x.y. Each
measurement runs in a process of its own (its peak RSS is its own):

- render: the plan and every node's scripts;
- diff: one prefill flag changed (both sides' graphs under the SDK's mocks, the engine model, the
  effect), and the rollout it estimates: waves of `rollout.maxUnavailable` per role;
- preview: a real `pulumi preview` (local backend; needs the CLI `setup.sh` builds), whole and the
  program's share of it (wall and CPU);
- the day-2 commands, against a simulated cluster of the same size (tools/sim_cluster.py: one real
  sshd answering on every node address, the suite's HTTP fakes answering as healthy ranks, workers,
  etcd and proxy), in network and mount namespaces of the benchmark's own (root), with the commands'
  default deadlines and `--parallel` (or the benchmark's `--parallel`):
  status (one poll of every rank, worker, etcd and the proxy, no smoke), heal --dry-run (a poll and
  its judgement), logs --tail 50 of every source, bundle (every node's logs and facts, status,
  doctor, etcd).

  venv/bin/python -m tools.scale_bench                    # 64 and 256 nodes
  venv/bin/python -m tools.scale_bench --nodes 16 64 --skip preview --skip bundle
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from tools import sim_cluster

STACK = "a2-8node"
ROOT = Path(__file__).resolve().parents[1]
DAY2 = ("status", "heal-dry-run", "logs", "bundle")  # against the simulated cluster
STEPS = ("render", "diff", "preview", *DAY2)
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBenchBenchBenchBenchBenchBenchBenchBench01"


def address(i: int) -> str:
    return f"127.1.{i // 250}.{i % 250 + 1}"


def generated(nodes: int, *, prefill_flag: bool = False) -> dict[str, str]:
    """The `ascend-pd:*` map of the committed a2-8node stack grown to `nodes` nodes."""
    from ascend_pd.change.sources import working_tree

    if nodes % 8:
        raise SystemExit(f"--nodes {nodes}: a multiple of 8 (half prefill, half decode in 4-node instances)")
    cfg = dict(working_tree(STACK, ROOT).config)
    template = json.loads(cfg["ascend-pd:nodes"])[0]
    half = nodes // 2
    names = [f"p{i}" for i in range(half)] + [f"d{i}" for i in range(half)]
    cfg["ascend-pd:nodes"] = json.dumps([{"name": n, "address": address(i), "nic": template["nic"]}
                                         for i, n in enumerate(names)])
    prefill, decode = json.loads(cfg["ascend-pd:prefill"]), json.loads(cfg["ascend-pd:decode"])
    prefill["nodes"], decode["nodes"] = names[:half], names[half:]
    if prefill_flag:
        prefill.setdefault("flags", {})["max-num-seqs"] = 7
    cfg["ascend-pd:prefill"], cfg["ascend-pd:decode"] = json.dumps(prefill), json.dumps(decode)
    ssh = json.loads(cfg.get("ascend-pd:ssh", "{}"))
    ssh["hostKeys"] = {n: os.environ.get("APD_BENCH_HOST_KEY", HOST_KEY) for n in names}
    cfg["ascend-pd:ssh"] = json.dumps(ssh)
    return cfg


def measure(step: str, nodes: int) -> dict:
    """One step, in this process: seconds, and what it found."""
    from ascend_pd import scripts
    from ascend_pd.change.compare import plan_of

    t0 = time.monotonic()
    if step == "render":
        plan = plan_of(STACK, generated(nodes))
        count = sum(len(scripts.node_scripts(plan, n.name)) for n in plan.nodes)
        found = f"{len(plan.ranks)} ranks, {count} scripts"
    elif step == "diff":
        from ascend_pd.change import compare
        from ascend_pd.change.sources import Side

        change = compare(STACK, Side("generated", generated(nodes)),
                         Side("prefill flag", generated(nodes, prefill_flag=True)))
        roles = {r.role: r for r in change.effect.roles}
        p = roles["prefill"]
        found = (f"{len(change.steps)} steps; prefill: {len(p.restarting)} instances, {p.max_unavailable} at a time, "
                 f"{p.duration_s / 60:.0f} min")
    elif step == "preview":
        return _preview(nodes)
    elif step in DAY2:
        found = _day2(step, plan_of(STACK, generated(nodes)))
    else:
        raise SystemExit(f"unknown step {step!r}: {', '.join(STEPS)}")
    seconds = time.monotonic() - t0
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"step": step, "nodes": nodes, "seconds": round(seconds, 2),
            "cpu_s": round(own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime, 2),
            # `diff` captures the two sides in forked children: the largest of them, beside this process
            "peak_rss_mb": round(own.ru_maxrss / 1024, 1), "child_peak_rss_mb": round(children.ru_maxrss / 1024, 1),
            "found": found}


def _day2(step: str, plan) -> str:
    """One day-2 command against the simulated cluster, with its defaults; what it found."""
    from ascend_pd import ssh
    from ascend_pd.status import Timeouts, collect_status

    ssh.set_parallel(int(os.environ.get("APD_BENCH_PARALLEL", ssh.DEFAULT_PARALLEL)))
    targets = ssh.ssh_targets(plan, identity_file=os.environ.get("APD_BENCH_IDENTITY"))
    if step == "status":
        report = collect_status(plan, timeouts=Timeouts(), smoke=False)
        return f"{len(report.ranks)} ranks polled, {len(report.problems)} problems"
    if step == "heal-dry-run":
        from ascend_pd import heal

        rep = heal.Healer(plan, lambda node, command, timeout_s: (1, "", "dry run")).heal_once(dry_run=True)
        return f"{len(rep.broken)} instances broken, {len(rep.workers)} workers to restart"
    if step == "logs":
        from ascend_pd.logs import fetch
        from ascend_pd.logsources import select

        got = fetch(plan, select(plan), targets, tail=50)
        return (f"{len(got.logs)} sources on {len(plan.nodes)} nodes, {len(got.unreachable)} nodes not read, "
                f"--parallel {ssh.parallel()}")
    import tempfile

    from ascend_pd.bundle import make_bundle

    with tempfile.TemporaryDirectory(prefix="apd-bench-") as tmp:
        res = make_bundle(plan, targets, Path(tmp) / "b.tar.gz", identity_file=os.environ.get("APD_BENCH_IDENTITY"))
        late = [m for m in res.missing if "not started" in m or "within the deadline" in m or "no answer" in m]
        return (f"{res.files} files, {res.size / 1e6:.1f} MB, {len(res.missing)} not collected ({len(late)} late), "
                f"--parallel {ssh.parallel()}")


# The program as the language host runs it, timed from the interpreter's start to its exit (after the
# SDK has sent the last registration and waited for every answer), and its own CPU time: the program's
# share of the preview (the rest of the wall time is the CLI's start and the engine's end; the
# engine and the providers run beside the program, on the same cores).
TIMED_MAIN = """import atexit, json, os, time
_t0 = time.time()
atexit.register(lambda: open(os.environ["APD_BENCH_TIMES"], "w").write(json.dumps([_t0, time.time(), time.process_time()])))
exec(compile(open(os.environ["APD_BENCH_MAIN"]).read(), "__main__.py", "exec"))
"""


def _preview(nodes: int) -> dict:
    """A real `pulumi preview` of the generated stack (local backend, no node is reached: Commands and
    the docker resources only diff at preview), timed whole and for the program's share."""
    import shutil
    import tempfile

    import yaml

    cli = shutil.which("pulumi") or str(Path.home() / ".cache/ascend-pd/pulumi-toolchain/bin/pulumi")
    if not Path(cli).exists():
        raise SystemExit("preview: no pulumi CLI (bash setup.sh builds one)")
    work = Path(tempfile.mkdtemp(prefix="apd-bench-"))
    try:
        (work / "state").mkdir()
        (work / "Pulumi.yaml").write_text(yaml.safe_dump({
            "name": "ascend-pd", "runtime": {"name": "python", "options": {"virtualenv": str(ROOT / "venv")}}}))
        (work / "__main__.py").write_text(TIMED_MAIN)
        config = {k: json.loads(v) if v[:1] in "[{" else v for k, v in generated(nodes).items()}
        (work / f"Pulumi.{STACK}.yaml").write_text(yaml.safe_dump({"config": config}, width=1000))
        times = work / "times.json"
        env = {**os.environ, "PULUMI_BACKEND_URL": f"file://{work / 'state'}", "PULUMI_CONFIG_PASSPHRASE": "bench",
               "PULUMI_SKIP_UPDATE_CHECK": "true", "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
               "PYTHONPATH": str(ROOT), "APD_BENCH_MAIN": str(ROOT / "__main__.py"), "APD_BENCH_TIMES": str(times),
               "PATH": os.pathsep.join([str(Path(cli).parent), os.environ.get("PATH", "")])}
        subprocess.run([cli, "stack", "init", STACK, "--non-interactive"], cwd=work, env=env, check=True,
                       capture_output=True)
        subprocess.run([cli, "config", "set", "--secret", "--stack", STACK, "ascend-pd:proxyApiKey", "bench-key"],
                       cwd=work, env=env, check=True, capture_output=True)  # proxy.auth is on by default
        t0 = time.time()
        done = subprocess.run([cli, "preview", "--non-interactive", "--stack", STACK], cwd=work, env=env,
                              capture_output=True, text=True)
        total = time.time() - t0
        if done.returncode != 0:
            raise SystemExit(f"preview failed:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
        start, end, cpu = json.loads(times.read_text())
        creates = next((line.strip() for line in done.stdout.splitlines() if "to create" in line), "?")
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return {"step": "preview", "nodes": nodes, "seconds": round(total, 2),
                "cpu_s": round(children.ru_utime + children.ru_stime, 2),
                "peak_rss_mb": 0.0, "child_peak_rss_mb": round(children.ru_maxrss / 1024, 1),
                "found": f"{creates}; the program: {end - start:.1f} s of it, {cpu:.1f} s CPU"}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.scale_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--skip", choices=STEPS, action="append", default=[])
    ap.add_argument("--parallel", type=int, help="the day-2 commands' ssh sessions at once (their default otherwise)")
    ap.add_argument("--one", choices=STEPS, help=argparse.SUPPRESS)  # a child: one step, JSON on stdout
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.nodes[0])))
        return 0
    day2 = [s for s in DAY2 if s not in args.skip]
    if day2 and not sim_cluster.in_namespace():
        return sim_cluster.reexec_in_namespace(["tools.scale_bench", *(sys.argv[1:] if argv is None else argv)])
    sim = sim_cluster.SimCluster() if day2 else None
    if sim is not None:
        os.environ.update({"APD_BENCH_HOST_KEY": sim.host_key, "APD_BENCH_IDENTITY": str(sim.identity),
                           **({"APD_BENCH_PARALLEL": str(args.parallel)} if args.parallel else {})})
    try:
        return _rows(args, sim)
    finally:
        if sim is not None:
            sim.close()


def _rows(args, sim) -> int:
    rows = []
    for nodes in args.nodes:
        if sim is not None:
            sim.http(nodes)
        for step in STEPS:
            if step in args.skip:
                continue
            done = subprocess.run([sys.executable, "-m", "tools.scale_bench", "--one", step, "--nodes", str(nodes)],
                                  cwd=ROOT, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{step} at {nodes} nodes failed:\n{done.stderr[-2000:]}", file=sys.stderr)
                return 1
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            r = rows[-1]
            children = f" (+ {r['child_peak_rss_mb']:.1f} MB per child)" if r["child_peak_rss_mb"] else ""
            print(f"{r['nodes']:>5} nodes  {r['step']:<12} {r['seconds']:>7.2f} s  cpu {r['cpu_s']:>7.2f} s  "
                  f"{r['peak_rss_mb']:>7.1f} MB{children}  {r['found']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
