"""The server's gauges and the prefix cache's counters, read at render time from the scheduler (its
queues) and from the engine's last snapshot (which the engine thread takes between steps)."""

from __future__ import annotations

from specserve.scheduler import Scheduler


def gauges(scheduler: Scheduler) -> dict[str, float]:
    """name -> value: requests running and waiting, free KV rows, and the prefix cache's size."""
    snap = scheduler.snapshot
    out = {"specserve_requests_running": scheduler.num_running,
           "specserve_requests_waiting": scheduler.num_waiting,
           "specserve_kv_rows_free": snap.free_rows}
    if snap.prefix is not None:
        out |= {"specserve_prefix_cache_bytes": snap.prefix.used_bytes,
                "specserve_prefix_cache_capacity_bytes": snap.prefix.capacity_bytes,
                "specserve_prefix_cache_blocks": snap.prefix.blocks}
    return out


def counters(scheduler: Scheduler) -> dict[str, tuple[str, int]]:
    """name -> (help, value): the prefix cache's running totals (none without a prefix cache)."""
    p = scheduler.snapshot.prefix
    if p is None:
        return {}
    return {
        "specserve_prefix_cache_hit_tokens_total": ("Prompt tokens copied from the prefix cache", p.hit_tokens),
        "specserve_prefix_cache_miss_tokens_total": ("Prompt tokens looked up in the prefix cache and not found",
                                                     p.miss_tokens),
        "specserve_prefix_cache_stored_blocks_total": ("Blocks added to the prefix cache", p.stored_blocks),
        "specserve_prefix_cache_evicted_blocks_total": ("Blocks evicted (least recently used leaf first)",
                                                        p.evicted_blocks)}
