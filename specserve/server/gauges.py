"""The server's gauges and the engine's counters, read at render time from the scheduler (its
queues) and from the engine's last snapshot (which the engine thread takes between steps).

Each function returns plain numbers by metric name (``metrics.Metrics`` turns them into families):
``gauges`` and ``counters`` name -> (help, value); ``labelled_counters`` name -> (help, label name,
{label value: count})."""

from __future__ import annotations

from specserve.scheduler import Scheduler


def gauges(scheduler: Scheduler) -> dict[str, tuple[str, float]]:
    """name -> (help, value): requests running and waiting, free KV rows, and the prefix cache's size."""
    snap = scheduler.snapshot
    out = {"specserve_requests_running": ("Requests admitted to the engine and not yet finished",
                                          scheduler.num_running),
           "specserve_requests_waiting": ("Requests queued for a KV row", scheduler.num_waiting),
           "specserve_kv_rows_free": ("KV cache rows free (one per sequence)", snap.free_rows)}
    if snap.prefix is not None:
        out |= {"specserve_prefix_cache_bytes": ("Bytes the prefix cache holds", snap.prefix.used_bytes),
                "specserve_prefix_cache_capacity_bytes": ("Bytes the prefix cache may hold",
                                                          snap.prefix.capacity_bytes),
                "specserve_prefix_cache_blocks": ("Blocks the prefix cache holds", snap.prefix.blocks)}
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


def labelled_counters(scheduler: Scheduler) -> dict[str, tuple[str, str, dict[str, int]]]:
    """name -> (help, label name, {label value: count}): drafter faults by drafter (spec) name."""
    faults = dict(scheduler.snapshot.drafter_faults)
    return {"specserve_drafter_faults_total": ("Drafter exceptions; the sequence continued by plain decoding",
                                               "drafter", faults)}
