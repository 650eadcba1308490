"""Command line: `ascend-pd render|status|doctor|diff|heal|exporter --stack NAME`, `ascend-pd docs [--write|--check]`
(also `python -m ascend_pd ...`). Exit codes: see EXIT_CODES."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Callable

from .errors import ConfigError
from .loader import PROJECT_DIR, find_stack, open_stack


# Bounds of the status options (seconds): below 0.1 s nothing on a LAN answers; above them a "timeout"
# bounds nothing (and inf/nan overflow the waits).
MIN_SECONDS = 0.1
MAX_TIMEOUT_S = 3600.0  # = ascend_pd.status.MAX_TIMEOUT_S (not imported: render must not load requests)
MAX_WATCH_S = 86400.0


def _seconds(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds in [low, high] (argparse names the option)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds from {low:g} to {high:g}")
        return value

    return parse


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of polls of at least 1")
    return value


STATUS_DESCRIPTION = (
    "Health of a deployed stack and its KV cache hit rates, from the stack file alone. "
    "Exit code 0: everything expected is there and healthy; 1: something is missing or unhealthy "
    "(a reason per component is printed); 2: the stack file or an option is invalid. "
    "Bounds: all requests of a poll run at once, and each one (connect, request, the whole answer and "
    "its parsing) ends within --timeout (the smoke completion within --smoke-timeout), whatever the "
    "endpoint does, so one poll takes at most max(--timeout, --smoke-timeout) seconds (10 by default, 5 "
    "with --no-smoke) and the command that plus its own start (about 0.5 s: Python, the stack file). "
    "An answer is capped at 4 MiB (/metrics) or 1 MiB (everything else): a larger one is a problem of "
    "that component, and so is a compressed one."
)

DIFF_DESCRIPTION = (
    "Compare the stack file with its base (a git ref, or an old copy of the file): render both under "
    "Pulumi's mocks with the working tree's code, run the engine model of `pulumi up` from one to the other, "
    "and report every step in order, each changed script per node (shared library files collapsed), "
    "which ranks, workers, etcd or proxy restart, whether each role keeps serving, and for about how long. "
    "Exit code 0: no change; 10: changes; 2: the new stack file is invalid (only its problems are printed) "
    "or the base cannot be read."
)


DOCTOR_CHECKS = ("clock", "versions", "page-size", "memory", "npu", "fabric", "ping", "ports", "weights", "docker",
                 "network", "firewall")  # = ascend_pd.scripts.preflight.ALL_CHECKS (render must not import more than it needs)
# Rows of the doctor table that another check produces: `--only hccn-conf` runs that check.
CHECK_ALIASES = {"hccn-conf": "fabric"}


def doctor_checks(only: list[str]) -> tuple[list[str], list[str]]:
    """(the checks to run for `--only` names, the names that are no check)."""
    wanted = [CHECK_ALIASES.get(c, c) for c in only]
    return list(dict.fromkeys(wanted)), [c for c in only if CHECK_ALIASES.get(c, c) not in DOCTOR_CHECKS]


DOCTOR_DESCRIPTION = (
    "Run the preflight checks on every node over ssh (the operator's OpenSSH client, ssh-agent, known_hosts), "
    "all nodes at once, then the cross-node checks (clock skew, identical driver/CANN, identical weights, the "
    "NPU ping matrix). Prints a node x check table and, for each failure, the reason and the fix. Exit code "
    "0: nothing failed (warnings allowed); 1: a check failed or a node is unreachable; 2: the stack file or "
    "an option is invalid. Each round ends within --timeout per node; an unreachable node costs at most "
    "--connect-timeout."
)


HEAL_DESCRIPTION = (
    "Find broken instances (a rank dead: /health or the connection fails; hung: requests running and "
    "vllm:generation_tokens_total and vllm:request_success_total flat for hang.seconds; or ranks not in one DP "
    "group) and dead openYuanrong workers, and bring them back with the very scripts Pulumi runs, over SSH: "
    "the worker first, then each broken instance as a whole (out of the proxy, stopped on every node, started, "
    "healthy, one request, back in), the others serving throughout. Pulumi's state is not touched: the next "
    "preview shows no change. A restart budget per instance (--max-restarts N within --window MIN, with "
    "backoff) keeps a crash loop out of the proxy. An instance with a node that does not answer is not touched "
    "(its live ranks keep running): heal names the node and what replaces it. Exit 0: nothing broken, or all healed; 1: something left "
    "broken or out; 2: invalid stack file or option."
)


EXPORTER_DESCRIPTION = (
    "Serve Prometheus metrics of what no component exports, read as `status` reads it: the openYuanrong "
    "workers' registrations and the rollout restart slots (their age from the slot's lease) and failure marks "
    "in etcd, the PD proxy's /healthcheck, and a P/D smoke completion through the proxy every "
    "monitoring.smokeIntervalS seconds. GET /metrics (Prometheus text format, or OpenMetrics when asked for), GET / (a hint). A scrape's "
    "requests end within 0.8 x monitoring.scrapeIntervalS (at most 5 s); a failed check is a 0 or an absent "
    "series, never an error answer. Runs until SIGTERM (exit 0) or Ctrl-C (130); exit 2: invalid stack file or "
    "option, or the address cannot be listened on."
)

LOGS_DESCRIPTION = (
    "Show the logs of the stack's ranks, openYuanrong workers, etcd and proxy, read over SSH from every node "
    "at once (doctor's transport and settings) inside the NPU container where the launch scripts write them "
    "(<stateDir>/logs/). With no selector: everything. --role/--instance/--rank and the services worker, etcd, "
    "proxy add up; --node narrows. Every line is prefixed with its rank (or service) and node. A node that does "
    "not answer within --timeout is one line on stderr and the others are shown. -f follows every selected log "
    "until ^C. Exit 0: every node read; 1: a node could not be read; 2: invalid stack file or selector."
)

BUNDLE_DESCRIPTION = (
    "Write one .tar.gz for a support ticket: the plan (render's summary and the stack file), status --json, "
    "versions, per node the last lines of every log, the container's inspect, the ranks' processes, npu-smi, "
    "huge pages, memory, disk and a dmesg tail, doctor's NPU and fabric checks, and the stack's keys in etcd. "
    "A MANIFEST says what each file is and what could not be collected and why. Every node at once within "
    "--timeout; per file and total size caps. Secrets (the SSH key, tokens, values of secret-looking variables, "
    "Pulumi secure values) are redacted from every file. Exit 0 when the bundle is written (what is missing is "
    "in its MANIFEST); 2: invalid stack file or option."
)

FORGET_DESCRIPTION = (
    "For a node that is gone for good (no SSH, never coming back as it was). First edit the stack file: remove "
    "NODE, or put the machine that replaces it there under another name (a spare). Then forget-node checks that "
    "NODE's SSH port does not answer (refuses if it does, unless --force), exports the state to a backup file, "
    "runs `pulumi up` with NODE's resources excluded (everything else converges on the edited stack; nothing "
    "dials NODE), removes exactly NODE's resources from the state (`pulumi state delete`), and writes the script "
    "that cleans NODE should it come back. Needs the `pulumi` CLI and the stack's backend and passphrase, as "
    "`pulumi up` does. Exit 0: forgotten and converged (or --dry-run: previewed); 1: a Pulumi step failed (what "
    "is left is printed; the backup is kept); 2: the stack file, NODE or an option is invalid, or NODE answers."
)

REPLAN_DESCRIPTION = (
    "For a node lost for good: propose the stack edit that keeps serving without it, found among a few layouts in "
    "order of preference and held to the plan's own rules (DP sizes, ranks, ports, kv ports, devices): a warm spare "
    "(a node of no role) in its place; else, for a decode node, a prefill node joins the decode group in its place "
    "and prefill runs one instance fewer; else the role runs one instance fewer; else its one instance runs on one "
    "node fewer. "
    "Every layout also takes NODE out of nodes and ssh.hostKeys, and moves etcd, the proxy and Prometheus off it. "
    "Prints the edit (a diff of the stack file), the capacity left, and what `diff` says applying it does (what "
    "restarts, for how long). --write applies it (comments kept; the file as it was is kept beside it, which is "
    "also how NODE comes back once repaired). Then `forget-node` converges the state without the dead machine. "
    "Exit 0: proposed (or written); 2: the stack file or NODE is invalid, or no legal layout exists without NODE "
    "(a spare is needed)."
)

# Every exit code a subcommand can return, in one place: the README's table is checked against it.
EXIT_CODES = {
    0: "success: nothing failed (status: all healthy; doctor: no failed check; heal: nothing broken or all healed; "
       "diff: no change; exporter: stopped by SIGTERM; logs: every node read, -f ended by Ctrl-C; bundle: written; "
       "forget-node: forgotten, the rest converged; replan: proposed or written)",
    1: "something is wrong on the cluster: unhealthy, a failed check, left broken (heal --dry-run: found broken; "
       "logs: a node could not be read; forget-node: a Pulumi step failed)",
    2: "the stack file, an option or a path given is invalid (forget-node: or the node still answers; replan: or no "
       "legal layout without the node); nothing was changed",
    10: "diff only: the stack file changes something",
    130: "interrupted (Ctrl-C)",
    141: "the reader of the output went away (a closed pipe, e.g. `| head`)",
}


def _prog() -> str:
    """`ascend-pd` when run as the installed command, else `python -m ascend_pd` (what the user typed)."""
    return "ascend-pd" if os.path.basename(sys.argv[0] or "") == "ascend-pd" else "python -m ascend_pd"


def cli(argv: list[str] | None = None) -> int:
    """The console script: `main`, with no traceback for what an operator does on purpose."""
    try:
        code = main(argv)
        sys.stdout.flush()
        return code
    except KeyboardInterrupt:
        ssh = sys.modules.get("ascend_pd.ssh")
        if ssh is not None:  # whatever was interrupted, no ssh of ours outlives the command
            ssh.kill_live()
        print(f"{_prog()}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader closed the pipe (`| head`): say nothing more, and point stdout at /dev/null so the
        # interpreter's final flush does not raise again on the way out.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _stack_options(parser: argparse.ArgumentParser, what: str = "reads it") -> None:
    parser.add_argument("--stack", metavar="NAME",
                        help=f"stack name: {what} from Pulumi.NAME.yaml in the current directory, else the project's")
    parser.add_argument("--stack-file", type=Path, metavar="PATH",
                        help="the stack file itself (Pulumi.NAME.yaml), anywhere; its Pulumi.yaml is the one beside it")


def _out_dir_problem(out: Path) -> str | None:
    """Why `render --out` cannot write there, before anything is written (None: it can)."""
    if out.exists() and not out.is_dir():
        return f"{out} exists and is not a directory; give a directory (it is created if missing)"
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable by this user"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=_prog(), description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="print the rank table and proxy endpoints; --out writes every node's scripts")
    _stack_options(r)
    r.add_argument("--out", type=Path, help="directory for <node>/<NN>-<script>.{create,delete}.sh")
    r.add_argument("--project-dir", type=Path, default=PROJECT_DIR, help=argparse.SUPPRESS)
    s = sub.add_parser(
        "status",
        help="poll etcd, the openYuanrong workers, every rank, the proxy; KV cache hit rates",
        description=STATUS_DESCRIPTION,
    )
    _stack_options(s)
    s.add_argument("--json", action="store_true", help="machine-readable report (one JSON line per poll with --watch)")
    s.add_argument("--watch", type=_seconds(MIN_SECONDS, MAX_WATCH_S), metavar="SECONDS",
                   help="poll again every SECONDS (adds hit rates over the last interval) until ^C; a poll "
                   "that takes longer is followed by the next at once")
    s.add_argument("--count", type=_positive_int, metavar="N", help="with --watch: stop after N polls")
    s.add_argument("--timeout", type=_seconds(MIN_SECONDS, MAX_TIMEOUT_S), metavar="S", default=None,
                   help="deadline of every request to etcd, a rank or the proxy, from connect to the last "
                   "byte of the answer (default 5; the TCP connect within it at most 2)")
    s.add_argument("--smoke-timeout", type=_seconds(MIN_SECONDS, MAX_TIMEOUT_S), metavar="S", default=None,
                   help="deadline of the smoke chat completion through the proxy (default 10)")
    s.add_argument("--no-smoke", action="store_true", help="skip the smoke chat completion")
    s.add_argument("-v", "--verbose", action="store_true",
                   help="list every component's problem (an unreachable node is otherwise one line); --json always does")
    s.add_argument("--project-dir", type=Path, default=PROJECT_DIR, help=argparse.SUPPRESS)
    dr = sub.add_parser(
        "doctor",
        help="preflight: check every node (versions, pages, memory, clocks, NPUs, fabric, ports, weights, docker, "
        "network) before deploying",
        description=DOCTOR_DESCRIPTION,
    )
    _stack_options(dr)
    dr.add_argument("--json", action="store_true", help="machine-readable report")
    dr.add_argument("--node", action="append", default=[], metavar="N", help="only this node (repeatable)")
    dr.add_argument("--only", action="append", default=[], metavar="CHECK",
                    help="only this check (repeatable): " + ", ".join(DOCTOR_CHECKS + tuple(CHECK_ALIASES)))
    dr.add_argument("--identity", metavar="FILE", help="ssh private key (default: ssh-agent and ~/.ssh/config)")
    dr.add_argument("--known-hosts", metavar="FILE",
                    help="known_hosts file (default: the stack's ssh.hostKeys when every node has one, else "
                    "~/.ssh/known_hosts)")
    dr.add_argument("--print-host-keys", action="store_true",
                    help="print the SSH host key every node presents now, as the ssh.hostKeys block to pin (after "
                    "checking each on the node) and known_hosts lines; runs no check")
    dr.add_argument("--timeout", type=_seconds(1.0, MAX_TIMEOUT_S), metavar="S", default=30.0,
                    help="deadline of each node's run, connection included (default 30)")
    dr.add_argument("--connect-timeout", type=_seconds(1.0, 120.0), metavar="S", default=5.0,
                    help="ssh connection deadline per node (default 5)")
    _parallel_option(dr)
    dr.add_argument("--project-dir", type=Path, default=PROJECT_DIR, help=argparse.SUPPRESS)
    c = sub.add_parser(
        "diff",
        help="what a change of the stack file does to the running cluster: steps, script diffs, restarts",
        description=DIFF_DESCRIPTION,
    )
    _stack_options(c, "compares it with its base")
    base = c.add_mutually_exclusive_group()
    base.add_argument("--base", metavar="GIT-REF", help="the stack file as committed at GIT-REF (default HEAD)")
    base.add_argument("--base-file", type=Path, metavar="OLD.yaml", help="an old copy of the stack file")
    c.add_argument("--format", choices=("text", "markdown", "json"), default="text",
                   help="text (default), markdown (a PR comment) or json")
    c.add_argument("--preview-json", type=Path, metavar="FILE",
                   help="the output of `pulumi preview --json --stack STACK` against the stack's real state: the "
                        "steps are the engine's own (default: the engine model's, from the base)")
    c.add_argument("--project-dir", type=Path, default=PROJECT_DIR, help=argparse.SUPPRESS)
    h = sub.add_parser(
        "heal",
        help="restart dead or hung instances as a whole (and dead openYuanrong workers), with the rendered scripts",
        description=HEAL_DESCRIPTION,
    )
    _stack_options(h)
    h.add_argument("--dry-run", action="store_true", help="say what is broken and what would be done; change nothing")
    h.add_argument("--watch", type=_seconds(1.0, MAX_WATCH_S), metavar="SECONDS",
                   help="supervise: a cycle every SECONDS until ^C (hangs need it: one poll has no history)")
    h.add_argument("--count", type=_positive_int, metavar="N", help="with --watch: stop after N cycles")
    h.add_argument("--max-restarts", type=_positive_int, metavar="N", default=None,
                   help="restarts of one instance allowed within --window (default 3); past it the instance stays "
                   "out of the proxy")
    h.add_argument("--window", type=_seconds(1.0, 7 * 24 * 60), metavar="MIN", default=None,
                   help="the restart budget's window in minutes (default 30)")
    h.add_argument("--state", type=Path, default=None, metavar="FILE",
                   help="the restart budget between runs (default ~/.local/state/ascend-pd/heal-<stack>.json)")
    h.add_argument("--reset", metavar="INSTANCE", action="append", default=[],
                   help="a person fixed INSTANCE: give it its restart budget back")
    h.add_argument("--identity", metavar="FILE", help="ssh private key (default: ssh-agent and ~/.ssh/config)")
    h.add_argument("--known-hosts", metavar="FILE",
                   help="known_hosts file (default: the stack's ssh.hostKeys when every node has one, else "
                   "~/.ssh/known_hosts)")
    _parallel_option(h)
    h.add_argument("--project-dir", type=Path, default=PROJECT_DIR, help=argparse.SUPPRESS)
    _logs_parsers(sub)
    fg = sub.add_parser("forget-node", help="converge the stack without a node that is gone for good (after the "
                        "stack edit that removes or replaces it)", description=FORGET_DESCRIPTION)
    _stack_options(fg)
    fg.add_argument("node", metavar="NODE", help="the node's name in the state (no longer in the stack file)")
    fg.add_argument("--dry-run", action="store_true",
                    help="say what would be forgotten and preview the rest; change nothing")
    fg.add_argument("--force", action="store_true",
                    help="forget NODE even though its SSH port answers (a machine broken in a way that must not "
                    "be touched)")
    fg.add_argument("--connect-timeout", type=_seconds(1.0, 120.0), metavar="S", default=10.0,
                    help="how long NODE's SSH port gets to answer before it counts as gone (default 10)")
    fg.add_argument("--backup-dir", type=Path, metavar="DIR", default=None,
                    help="where the state backup and the node's cleanup script go (default "
                    "~/.local/state/ascend-pd/backups)")
    fg.add_argument("--project-dir", type=Path, default=PROJECT_DIR, help=argparse.SUPPRESS)
    rp = sub.add_parser("replan", help="the stack edit that keeps serving without a node lost for good (a warm spare in "
                        "its place, or a layout without it)",
                        description=REPLAN_DESCRIPTION)
    _stack_options(rp)
    rp.add_argument("--without", required=True, metavar="NODE", help="the node to do without")
    rp.add_argument("--write", action="store_true", help="apply the edit to the stack file (default: only print it)")
    rp.add_argument("--project-dir", type=Path, default=PROJECT_DIR, help=argparse.SUPPRESS)
    x = sub.add_parser(
        "exporter",
        help="serve Prometheus metrics of what no component exports: worker registrations, rollout slots, the proxy, "
        "a P/D smoke",
        description=EXPORTER_DESCRIPTION,
    )
    _stack_options(x)
    x.add_argument("--listen", metavar="HOST:PORT", default=None,
                   help="where to serve /metrics (default: monitoring.exporter of the stack, else 127.0.0.1:9478; "
                   "port 0: a free one, printed at start)")
    x.add_argument("--project-dir", type=Path, default=PROJECT_DIR, help=argparse.SUPPRESS)
    d = sub.add_parser(
        "docs",
        help="the reference page's generated sections (settings, derived flags, deployment table) from the code",
        description="Print the generated sections of docs/reference.md; --write rewrites them there, --check exits 1 "
        "when the page is stale.",
    )
    mode = d.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the sections in docs/reference.md")
    mode.add_argument("--check", action="store_true", help="exit 1 if docs/reference.md differs from the code")
    args = ap.parse_args(argv)
    listen = None
    if args.command == "exporter" and args.listen is not None:
        from .exporter import parse_listen

        try:
            listen = parse_listen(args.listen)
        except ValueError as exc:
            ap.exit(2, f"{ap.prog} exporter: --listen {exc}\n")
    if args.command != "docs" and not (args.stack or args.stack_file):
        ap.exit(2, f"{ap.prog} {args.command}: give --stack NAME or --stack-file PATH\n")
    # --project-dir (tests) defaults to the checkout, which the lookup reads as "current directory first".
    if getattr(args, "count", None) is not None and not getattr(args, "watch", None):
        ap.exit(2, f"{ap.prog} {args.command}: --count N needs --watch SECONDS (it counts the polls of a watch)\n")
    if args.command == "render" and args.out is not None:
        problem = _out_dir_problem(args.out)
        if problem:
            ap.exit(2, f"{ap.prog} render: --out {problem}\n")
    if args.command == "docs":
        from .docs import main as docs_main

        return docs_main(write=args.write, check=args.check)
    if args.command == "forget-node":
        return _forget_node(args)
    if args.command == "replan":
        return _replan(args)
    if args.command == "diff":
        from .change import run as diff_run

        try:
            files = find_stack(args.stack, args.project_dir, stack_file=args.stack_file)
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            return 2
        return diff_run(files.name, project_dir=files.stack_file.parent, base=args.base, base_file=args.base_file,
                        fmt=args.format, preview_json=args.preview_json)
    try:
        stack = open_stack(args.stack, args.project_dir, stack_file=args.stack_file)
        if args.command == "doctor" and args.print_host_keys:  # what to pin: the stack may have no keys yet
            return _print_host_keys(stack, args.connect_timeout)
        plan = stack.build_plan()
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.command in ("render", "doctor"):  # before a deploy: what the images' release will not read
        for problem in plan.warnings:
            print(f"warning: {problem}", file=sys.stderr)
    if getattr(args, "parallel", None) is not None:  # doctor, logs, bundle, heal: ssh sessions at once
        from .ssh import set_parallel

        set_parallel(args.parallel)
    if args.command == "render":
        from . import term
        from .render import summary_blocks, write_scripts

        term.write(summary_blocks(plan))
        if args.out:
            from .dashboard import write_dashboard
            from .monitoring import MONITORING_DIR, write_monitoring

            try:
                with term.progress(f"writing scripts under {args.out}") as update:
                    files = write_scripts(plan, args.out, progress=update)
                # Beside the node directories: a node may not be named like it (config.py refuses that name).
                monitoring = write_monitoring(plan, plan.cfg.monitoring, args.out / MONITORING_DIR)
                dash = write_dashboard(plan, plan.cfg.monitoring, args.out / MONITORING_DIR)
            except OSError as exc:
                print(f"render: cannot write under {args.out}: {exc.strerror or exc} ({exc.filename or args.out})",
                      file=sys.stderr)
                return 2
            print(f"\nwrote {len(files)} scripts for {len(plan.nodes)} nodes under {args.out}, and "
                  f"{len(monitoring)} Prometheus files and a Grafana dashboard ({dash.name}) under "
                  f"{args.out / MONITORING_DIR}")
    elif args.command == "doctor":
        return _doctor(plan, args)
    elif args.command == "status":
        from .status import Timeouts, run

        t = Timeouts()
        if args.timeout is not None:
            t = Timeouts(connect_s=min(t.connect_s, args.timeout), request_s=args.timeout, smoke_s=t.smoke_s)
        if args.smoke_timeout is not None:
            t = Timeouts(connect_s=t.connect_s, request_s=t.request_s, smoke_s=args.smoke_timeout)
        return run(plan, as_json=args.json, watch=args.watch, count=args.count, timeouts=t,
                   smoke=not args.no_smoke, verbose=args.verbose)
    elif args.command == "exporter":
        from .exporter import run as exporter_run

        return exporter_run(plan, listen)
    elif args.command in ("logs", "bundle"):
        return _logs_or_bundle(plan, args)
    elif args.command == "heal":
        from . import heal

        if args.max_restarts is not None or args.window is not None:
            if args.max_restarts is None or args.window is None:
                print("heal: --max-restarts and --window go together (e.g. --max-restarts 3 --window 30)",
                      file=sys.stderr)
                return 2
        budget = heal.Budget(max_restarts=args.max_restarts or heal.DEFAULT_MAX_RESTARTS,
                             window_s=(args.window * 60) if args.window else heal.DEFAULT_WINDOW_S,
                             path=args.state or heal.default_state_path(plan.stack))
        runner = (lambda node, command, timeout_s: (1, "", "dry run")) if args.dry_run else heal.ssh_runner(
            plan, identity_file=args.identity, known_hosts_file=args.known_hosts)
        healer = heal.Healer(plan, runner, budget=budget, log=lambda m: print(m, file=sys.stderr, flush=True))
        for name in args.reset:
            if name not in {i.name for i in plan.instances}:
                print(f"heal: --reset {name}: the stack has no such instance "
                      f"({', '.join(i.name for i in plan.instances)})", file=sys.stderr)
                return 2
            if not args.dry_run:
                healer.reset(name)
        if args.watch:
            return heal.watch(healer, args.watch, count=args.count, dry_run=args.dry_run)
        rep = healer.heal_once(dry_run=args.dry_run)
        print(rep.text(), end="")
        return 0 if rep.ok else 1
    return 0


def _sessions(text: str) -> int:
    from .ssh import MAX_PARALLEL

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= MAX_PARALLEL:
        raise argparse.ArgumentTypeError(f"{text!r}: from 1 to {MAX_PARALLEL} ssh sessions at once")
    return value


def _parallel_option(p: argparse.ArgumentParser) -> None:
    from .ssh import DEFAULT_PARALLEL

    p.add_argument("--parallel", type=_sessions, metavar="N", default=DEFAULT_PARALLEL,
                   help=f"at most N ssh sessions at once (default {DEFAULT_PARALLEL}; through a jump host keep it "
                   "within its sshd's MaxStartups, 10 by default)")


def _ssh_options(p: argparse.ArgumentParser, timeout_s: float, what: str) -> None:
    _parallel_option(p)
    p.add_argument("--identity", metavar="FILE", help="ssh private key (default: ssh-agent and ~/.ssh/config)")
    p.add_argument("--known-hosts", metavar="FILE",
                   help="known_hosts file (default: the stack's ssh.hostKeys when every node has one, else "
                   "~/.ssh/known_hosts)")
    p.add_argument("--timeout", type=_seconds(1.0, MAX_TIMEOUT_S), metavar="S", default=timeout_s,
                   help=f"deadline of {what}, for all nodes, the wait for a session and the connection included "
                   f"(default {timeout_s:g})")
    p.add_argument("--connect-timeout", type=_seconds(1.0, 120.0), metavar="S", default=5.0,
                   help="ssh connection deadline per node (default 5)")
    p.add_argument("--project-dir", type=Path, default=PROJECT_DIR, help=argparse.SUPPRESS)


def _logs_parsers(sub) -> None:
    from .bundle import DEFAULT_LINES, DEFAULT_TIMEOUT_S as BUNDLE_TIMEOUT_S
    from .logs import DEFAULT_TIMEOUT_S

    lg = sub.add_parser("logs", help="the ranks', workers', etcd's and the proxy's logs from every node at once "
                        "(-f follows them)", description=LOGS_DESCRIPTION)
    _stack_options(lg)
    lg.add_argument("services", nargs="*", metavar="SERVICE", help="worker, etcd, proxy (with or without ranks)")
    lg.add_argument("--role", action="append", default=[], choices=("prefill", "decode"), help="this role's ranks")
    lg.add_argument("--instance", action="append", default=[], metavar="NAME", help="this instance's ranks "
                    "(prefill-0; repeatable)")
    lg.add_argument("--rank", action="append", default=[], metavar="NAME", help="this rank (prefill-0-r1; repeatable)")
    lg.add_argument("--node", action="append", default=[], metavar="N", help="only what runs on this node (repeatable)")
    lg.add_argument("--tail", type=_positive_int, metavar="N", default=None,
                    help="last N lines per source (default: a screenful; with --since up to 10000)")
    lg.add_argument("--since", metavar="WHEN", help="lines written since: 90s, 10m, 2h, 1d or 2026-12-05T12:00 "
                    "(by the lines' own timestamps)")
    lg.add_argument("--grep", metavar="PATTERN", default="", help="only lines matching this extended regex (grep -E)")
    lg.add_argument("-f", "--follow", action="store_true", help="follow every selected source until ^C")
    _ssh_options(lg, DEFAULT_TIMEOUT_S, "the read (with -f: until every node answers)")
    b = sub.add_parser("bundle", help="one .tar.gz for a support ticket: plan, status, versions, every node's logs "
                       "and facts, etcd keys; secrets redacted", description=BUNDLE_DESCRIPTION)
    _stack_options(b)
    b.add_argument("--out", type=Path, metavar="FILE", help="the bundle (default ascend-pd-<stack>-<UTC time>.tar.gz)")
    b.add_argument("--lines", type=_positive_int, metavar="N", default=DEFAULT_LINES,
                   help=f"last N lines of every log (default {DEFAULT_LINES})")
    _ssh_options(b, BUNDLE_TIMEOUT_S, "the whole collection")


def _logs_or_bundle(plan, args) -> int:
    from .ssh import ssh_targets

    targets = ssh_targets(plan, identity_file=args.identity, known_hosts_file=args.known_hosts,
                          connect_timeout_s=args.connect_timeout)
    if args.command == "bundle":
        from .bundle import default_out, make_bundle

        out = args.out or default_out(plan.stack)
        stack_file = find_stack(args.stack, args.project_dir, stack_file=args.stack_file).stack_file
        res = make_bundle(plan, targets, out, lines=args.lines, timeout_s=args.timeout, stack_file=stack_file,
                          log=lambda m: print(m, file=sys.stderr, flush=True))
        print(f"wrote {out} ({res.size} bytes, {res.files} files, {res.elapsed_s:.1f} s); "
              f"not collected: {len(res.missing)} (see its MANIFEST)")
        return 0
    from .logs import parse_since, run
    from .logsources import SelectionError, select

    try:
        picked = select(plan, roles=args.role, instances=args.instance, ranks=args.rank, nodes=args.node,
                        services=args.services)
        if args.since:
            parse_since(args.since)
    except (SelectionError, ValueError) as exc:
        print(f"logs: {exc}", file=sys.stderr)
        return 2
    if not picked:
        print("logs: the selectors name nothing that runs on the given node(s)", file=sys.stderr)
        return 2
    return run(plan, picked, targets, tail=args.tail, since=args.since, grep=args.grep, follow_=args.follow,
               timeout_s=args.timeout)


def _forget_node(args) -> int:
    from .forget import Forget, ForgetError, default_backup_dir, export_state, find_pulumi, pulumi_runner

    try:
        stack = open_stack(args.stack, args.project_dir, stack_file=args.stack_file)
        cwd = stack.files.stack_file.parent
        job = Forget(stack=stack.name, node=args.node, pulumi="", cwd=cwd,
                     stack_nodes={n.name: list(n.former_names) for n in stack.config.nodes},
                     backup_dir=args.backup_dir or default_backup_dir(), connect_timeout_s=args.connect_timeout,
                     force=args.force, dry_run=args.dry_run)
        job.check_stack()
        job.pulumi = find_pulumi()
        return job.run(pulumi_runner(job.pulumi, cwd), export_state(job.pulumi, cwd, stack.name))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    except ForgetError as exc:
        print(f"forget-node: {exc}", file=sys.stderr)
        return 2


def _replan(args) -> int:
    from . import term
    from .change import compare
    from .change.report import text_blocks
    from .change.sources import from_file
    from .replan import Replan, ReplanError

    try:
        files = find_stack(args.stack, args.project_dir, stack_file=args.stack_file)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    project = files.stack_file.parent

    def report(old: Path, new: Path) -> str:
        """`diff`'s report of the edit, up to the scripts' own diffs (`diff` shows those once it is written)."""
        blocks = text_blocks(compare(files.name, from_file(files.name, old, project),
                                     from_file(files.name, new, project)))
        cut = next((i for i, b in enumerate(blocks) if isinstance(b, str) and b.startswith(("== ", "library "))),
                   len(blocks))
        return term.plain(blocks[:cut]).rstrip() + "\n"

    try:
        return Replan(files.name, files.stack_file, project, args.without, write=args.write,
                      compare_report=report).run()
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    except ReplanError as exc:
        print(f"replan: {exc}", file=sys.stderr)
        return 2


def _print_host_keys(stack, timeout_s: float) -> int:
    import dataclasses

    from .hostkeys import print_host_keys

    cfg = stack.config
    unpinned = cfg.model_copy(update={"ssh": cfg.ssh.model_copy(update={"insecure_ignore_host_keys": True})})
    text, complete = print_host_keys(dataclasses.replace(stack, config=unpinned).build_plan(), timeout_s=timeout_s)
    print(text)
    return 0 if complete else 1


def _doctor(plan, args) -> int:
    import json

    from .doctor import run_doctor, table
    from .ssh import ssh_targets

    known = {n.name for n in plan.nodes}
    bad = [n for n in args.node if n not in known]
    if bad:
        print(f"--node {bad[0]}: not a node of stack {plan.stack} (nodes: {', '.join(sorted(known))})", file=sys.stderr)
        return 2
    only, bad = doctor_checks(args.only)
    if bad:
        print(f"--only {bad[0]}: not a check (checks: {', '.join(DOCTOR_CHECKS + tuple(CHECK_ALIASES))})",
              file=sys.stderr)
        return 2
    targets = ssh_targets(plan, identity_file=args.identity, known_hosts_file=args.known_hosts,
                          connect_timeout_s=args.connect_timeout)
    report = run_doctor(plan, targets, nodes=args.node, only=only, timeout_s=args.timeout)
    print(json.dumps(report.as_json()) if args.json else table(report))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(cli())
