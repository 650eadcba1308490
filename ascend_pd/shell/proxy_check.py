"""The PD proxy's readiness checks, run inside the container by the proxy script (`python -c`).

    proxy_check.py healthcheck PREFILL DECODE     (the /healthcheck JSON on stdin)

healthcheck: exit 0 when the proxy reports exactly PREFILL prefill and DECODE decode instances;
quietly 1 otherwise (it runs every 2 s until the deadline). The smoke completion is pd_smoke.py.
"""

import json
import sys


def healthcheck(prefill: str, decode: str) -> int:
    try:
        h = json.load(sys.stdin)
    except ValueError:
        return 1  # not listening yet: no body
    if not isinstance(h, dict):
        return 1
    return 0 if (h.get("prefill_instances"), h.get("decode_instances")) == (int(prefill), int(decode)) else 1


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    sys.exit(healthcheck(*args) if mode == "healthcheck" else 2)
