"""Worker flags for a 2-core test machine.

An idle openYuanrong worker at dscli's defaults spends about 11% of a core (measured: 111 ticks per
10 s, 499 threads), mostly in its stream-cache pollers: 16 `ScCopyToShm` threads (one per
`sc_regular_socket_num`/`sc_stream_socket_num` socket), 8 `ScPushToRemote` (`remote_send_thread_num`)
and 16 RPC prefetchers. The integration suites run up to 16 workers at once, which alone took the
two cores and pushed timing bounds over under CI. With these flags an idle worker takes about 4%
(41 ticks per 10 s, 307 threads). The tests use no stream cache and little RPC concurrency, so what
they check (registration, liveness, restart, stop) does not change; the stacks keep dscli's defaults.
"""

QUIET_WORKER_FLAGS = {
    "sc_regular_socket_num": 1,
    "sc_stream_socket_num": 1,
    "remote_send_thread_num": 1,
    "sc_scan_thread_num": 1,
    "sc_scan_interval_ms": 1000,
    "sc_gc_interval_ms": 1000,
    "rpc_thread_num": 2,
    "oc_thread_num": 2,
    "sc_thread_num": 2,
    "master_sc_thread_num": 2,
}
