"""The vLLM-Ascend PD proxy on the proxy node: started with every prefill and decode rank as its
backends, ready when `/healthcheck` counts all of them, proven by one chat completion that a prefill
rank and a decode rank both served (shell/pd_smoke.py)."""

from __future__ import annotations

from ..plan import PROXY_LAUNCHER, UNSET_ENV, Plan, proxy_key_file
from ..shell import (CURL, LOG_TAIL, PYTHON_DELIMITER, Script, background, fingerprint, header, heredoc, library,
                     managed_start, params, source_env_files, static_file)

STOP_GRACE_S = 30
HEALTHCHECK_POLL_S = 2
SMOKE_MAX_TOKENS = 16


def proxy(plan: Plan) -> Script:
    p, cfg = plan.proxy, plan.cfg
    pidfile, log = f"{plan.run_dir}/proxy.pid", f"{plan.log_dir}/proxy.log"
    start = background(p.argv, log, unset=UNSET_ENV, head=2)
    launcher = static_file(PROXY_LAUNCHER) if (cfg.proxy.keep_removed_out or cfg.proxy.auth) else ""
    spec = fingerprint(start, launcher)
    key_file = proxy_key_file(cfg)
    top = header(plan.stack, p.node, f"PD proxy {p.url}", converge=cfg.converge) + params(
        node=p.node, run_dir=plan.run_dir, log_dir=plan.log_dir, pidfile=pidfile, log=log, url=p.url,
        py=cfg.proxy.python, model=cfg.model.served_name, n_prefill=len(p.prefillers), n_decode=len(p.decoders),
        ready_timeout_s=cfg.proxy.ready_timeout_s, smoke_timeout_s=cfg.proxy.smoke_timeout_s, log_tail=LOG_TAIL,
        ranks=p.backends_json, key_file=key_file or "")
    # The launcher's text is part of the running proxy's identity: a new one restarts it.
    write_launcher = (f'cat >"$run_dir/{PROXY_LAUNCHER}" {heredoc(PYTHON_DELIMITER, launcher)}' if launcher else "")
    create = top + source_env_files(cfg.container.env_files) + library("lib") + f"""
proxy_check=$(cat {heredoc(PYTHON_DELIMITER, static_file("proxy_check.py"))})
pd_smoke=$(cat {heredoc(PYTHON_DELIMITER, static_file("pd_smoke.py"))})
if ! command -v "$py" >/dev/null 2>&1; then
  echo "ascend-pd:proxy.python $py is not found in the container on $node: name the interpreter that has fastapi, httpx and uvicorn" >&2
  exit 1
fi
if [ -n "$key_file" ] && [ ! -s "$key_file" ]; then
  echo "the proxy's key $key_file is missing on $node: pulumi up writes it (<node>-proxy-key) from the secret" >&2
  echo "ascend-pd:proxyApiKey (pulumi config set --secret ascend-pd:proxyApiKey KEY), or set ascend-pd:proxy.auth: false" >&2
  exit 1
fi
mkdir -p "$run_dir" "$log_dir"
{write_launcher}{managed_start("proxy", plan.run_dir, log, start, STOP_GRACE_S, spec=spec)}# /healthcheck must report every planned instance.
deadline=$((SECONDS + ready_timeout_s))
until {CURL} -fsS -m 5 "$url/healthcheck" 2>/dev/null | "$py" -c "$proxy_check" healthcheck "$n_prefill" "$n_decode"; do
  if ! pid_of "$pidfile" >/dev/null; then fail_with_log "$log" "the proxy exited before /healthcheck answered"; fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "last /healthcheck: $({CURL} -sS -m 5 "$url/healthcheck" 2>&1 || true)" >&2
    stop_pidfiles 10 "$pidfile"
    fail_with_log "$log" "proxy /healthcheck did not report $n_prefill prefill + $n_decode decode instances within ${{ready_timeout_s}}s"
  fi
  sleep {HEALTHCHECK_POLL_S}
done
# One chat completion through the proxy must return text that a prefill and a decode rank both served.
if ! "$py" -c "$pd_smoke" "$url" "$model" "$smoke_timeout_s" "$ranks" {SMOKE_MAX_TOKENS} "$key_file"; then
  stop_pidfiles 10 "$pidfile"
  fail_with_log "$log" "smoke completion through the proxy failed"
fi
echo "proxy ready at $url ($n_prefill prefill, $n_decode decode)"
"""
    delete = header(plan.stack, p.node, "PD proxy (stop)") + params(pidfile=pidfile, log_tail=LOG_TAIL) + library("lib") + f"""
stop_pidfiles {STOP_GRACE_S} "$pidfile"
echo "proxy stopped"
"""
    return Script("proxy", p.node, "container", create, delete, identity=(plan.state_dir,),
                  processes=(("proxy", spec),))
