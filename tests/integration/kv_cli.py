"""`python kv_cli.py HOST PORT set KEY VALUE` / `python kv_cli.py HOST PORT get KEY`: one openYuanrong
KVClient call, in its own process so that its client log dir (`$HOME/.datasystem`) lands in the HOME
of the simulated node it runs on. Prints the value (get) or `ok` (set); exits 1 with the error."""

import sys

from yr.datasystem import KVClient


def main(argv: list[str]) -> int:
    host, port, op, key = argv[0], int(argv[1]), argv[2], argv[3]
    client = KVClient(host, port, connect_timeout_ms=10000)
    client.init()
    if op == "set":
        client.set(key, argv[4])
        print("ok")
    elif op == "get":
        print(client.get([key], convert_to_str=True, sub_timeout_ms=5000)[0])
    else:
        print(f"unknown op {op}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except RuntimeError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
