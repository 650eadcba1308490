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
    args = ap.parse_args(argv)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
