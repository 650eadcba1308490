"""Command line: `python -m ascend_pd render|status --stack NAME`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import ConfigError
from .loader import PROJECT_DIR, load_stack
from .plan import build_plan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ascend_pd", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="print the rank table and proxy endpoints; --out writes every node's scripts")
    r.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    r.add_argument("--out", type=Path, help="directory for <node>/<NN>-<script>.{create,delete}.sh")
    r.add_argument("--project-dir", type=Path, default=PROJECT_DIR, help=argparse.SUPPRESS)
    s = sub.add_parser(
        "status",
        help="poll etcd, the openYuanrong workers, every rank, the proxy; KV cache hit rates",
        description="Health of a deployed stack and its KV cache hit rates, from the stack file alone. "
        "Exit code 0: everything expected is there and healthy; 1: something is missing or unhealthy "
        "(a reason per component is printed); 2: the stack file is invalid.",
    )
    s.add_argument("--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
    s.add_argument("--json", action="store_true", help="machine-readable report (one JSON line per poll with --watch)")
    s.add_argument("--watch", type=float, metavar="SECONDS",
                   help="poll again every SECONDS (adds hit rates over the last interval) until ^C")
    s.add_argument("--count", type=int, metavar="N", help="with --watch: stop after N polls")
    s.add_argument("--timeout", type=float, metavar="S", default=None,
                   help="bound of every request to etcd, a rank or the proxy (default 5)")
    s.add_argument("--smoke-timeout", type=float, metavar="S", default=None,
                   help="bound of the smoke chat completion through the proxy (default 10)")
    s.add_argument("--no-smoke", action="store_true", help="skip the smoke chat completion")
    s.add_argument("--project-dir", type=Path, default=PROJECT_DIR, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.command == "status":
        for name in ("watch", "timeout", "smoke_timeout"):
            value = getattr(args, name)
            if value is not None and not value > 0:
                ap.error(f"--{name.replace('_', '-')} must be a positive number of seconds")
        if args.count is not None and args.count < 1:
            ap.error("--count must be at least 1")
    try:
        plan = build_plan(load_stack(args.stack, args.project_dir), args.stack)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.command == "render":
        from .render import summary, write_scripts

        print(summary(plan))
        if args.out:
            files = write_scripts(plan, args.out)
            print(f"\nwrote {len(files)} scripts for {len(plan.nodes)} nodes under {args.out}")
    elif args.command == "status":
        from .status import Timeouts, run

        t = Timeouts()
        if args.timeout is not None:
            t = Timeouts(connect_s=min(t.connect_s, args.timeout), request_s=args.timeout, smoke_s=t.smoke_s)
        if args.smoke_timeout is not None:
            t = Timeouts(connect_s=t.connect_s, request_s=t.request_s, smoke_s=args.smoke_timeout)
        return run(plan, as_json=args.json, watch=args.watch, count=args.count, timeouts=t,
                   smoke=not args.no_smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())
