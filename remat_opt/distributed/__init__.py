"""Thunder's data parallelism (FSDP, DDP) as remat-opt plans it.

`data_parallel` builds the per-rank graphs of any world size in one process (offline planning);
`collective_order` is the pure ordering of FSDP collectives with at most k in flight, for trace
bound symbols and graph ops alike; `regather_order` applies it to Thunder traces and places backward
re-gathers just before their first use.
"""
