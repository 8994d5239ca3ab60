"""The profile's rates against the machine (``specserve.bench.profile``): multiply-adds per linear
part counted from the config, each part's rate and fraction of a ceiling, and the pass's floor, on
hand-built rows whose answers are worked out in the comments."""

from types import SimpleNamespace

import pytest

from specserve.bench.profile import format_rates, part_macs, part_rates

# hidden 64, 2 layers, 4 query heads and 2 kv heads of 16 dims, intermediate 128, vocabulary 1,000
CFG = SimpleNamespace(hidden_size=64, head_dim=16, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=128, vocab_size=1000)


def row(tokens: int, batch: int = 1, **parts_ms: float) -> dict:
    return {"runtime": {"name": "native:int8"}, "tokens": tokens, "batch": batch, "pass_ms": 2.0,
            "parts_ms": {"qkv": 0.0, "o": 0.0, "gate_up": 0.0, "down": 0.0, "lm_head": 0.0, **parts_ms}}


def test_part_macs_by_hand():
    """qkv 2 x 64 x 16 x (4 + 2 x 2); o 2 x 4 x 16 x 64; gate_up 2 x 2 x 128 x 64; down 2 x 128 x 64;
    LM head 1,000 x 64."""
    assert part_macs(CFG) == {"qkv": 16384, "o": 8192, "gate_up": 32768, "down": 16384, "lm_head": 64000}


def test_rates_fractions_and_the_floor():
    """4 tokens, qkv in 1 ms: 4 x 16,384 / 1e-3 = 65.536 M/s, 6.5536% of a 1 G/s ceiling; gate_up in
    2 ms: 65.536 M/s too; an untimed part has no rate.  Floor: 1 MB at 1 GB/s is 1 ms of memory against
    4 x 137,728 multiply-adds at 1 G/s = 0.551 ms, so memory; 40 tokens (as 4 rows of 10) take 5.51 ms
    of arithmetic, which is then the floor."""
    macs = part_macs(CFG)
    r = part_rates(row(4, qkv=1.0, gate_up=2.0), macs, ceiling=1e9, weight_bytes=10**6, bandwidth=1e9)
    assert r["multiply_adds_per_s"]["qkv"] == pytest.approx(65.536e6)
    assert r["of_ceiling"]["gate_up"] == pytest.approx(0.065536)
    assert "o" not in r["of_ceiling"] and r["floor"] == "memory" and r["floor_ms"] == pytest.approx(1.0)
    wide = part_rates(row(10, batch=4, qkv=1.0), macs, ceiling=1e9, weight_bytes=10**6, bandwidth=1e9)
    assert wide["floor"] == "arithmetic" and wide["floor_ms"] == pytest.approx(40 * 137728 / 1e6)
    assert wide["of_ceiling"]["qkv"] == pytest.approx(10 * 0.065536)


def test_format_rates_names_every_linear_part_and_the_floor():
    """One column per row; an untimed part is '-'; the pass (2 ms) over its 1 ms floor is 2.00x."""
    r = row(4, qkv=1.0)
    r["rates"] = part_rates(r, part_macs(CFG), 1e9, 10**6, 1e9)
    text = format_rates([r])
    assert "| qkv | 7% |" in text and "| o | - |" in text
    assert "| floor of the pass (ms) | 1.00 (memory) |" in text and "| pass over its floor | 2.00x |" in text
