# shellcheck shell=bash
# Shared by the fake vendor tools: `val KEY DEFAULT` reads KEY=VALUE from the node's scenario file
# (the loopback test gives each fake node its own /usr/local/ascend-pd-fake/scenario). Read once
# with builtins only: a ping matrix calls the fakes hundreds of times on a loaded machine.
SCENARIO=${APD_FAKE_SCENARIO:-/usr/local/ascend-pd-fake/scenario}
declare -A _scn=()
if [ -r "$SCENARIO" ]; then
  while IFS='=' read -r _k _v || [ -n "$_k" ]; do
    if [ -n "$_k" ]; then _scn[$_k]=$_v; fi
  done < "$SCENARIO"
fi
val() {
  if [ -n "${_scn[$1]+set}" ]; then printf '%s' "${_scn[$1]}"; else printf '%s' "$2"; fi
}
