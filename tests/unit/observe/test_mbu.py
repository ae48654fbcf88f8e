"""MBU and MFU arithmetic with literal numbers, and the per-model rolling estimate."""

from __future__ import annotations

import pytest

from llmobs.observe.mbu import (
    Decode,
    EfficiencyTracker,
    ModelShape,
    busy_time,
    decode_estimate,
    kv_bytes_per_token,
    kv_element_bytes,
    mbu,
    mfu,
    weight_bytes,
)
from llmobs.observe.timing import Outcome, RequestStats, TokenSource

# Llama-3.1-8B: 8.03e9 parameters, 32 layers, 8 KV heads (GQA), head dim 128.
H100_BW = 3.35e12


def test_weights_and_kv_bytes() -> None:
    assert weight_bytes(8e9, "bf16") == 16e9
    assert weight_bytes(8e9, "fp8") == 8e9
    assert weight_bytes(70e9, "int4") == 35e9
    assert kv_bytes_per_token(32, 8, 128, 2.0) == 131_072  # 128 KiB per token
    assert kv_element_bytes("auto", "bf16") == 2.0
    assert kv_element_bytes("auto", "int4") == 2.0  # 4-bit weights, 16-bit activations
    assert kv_element_bytes("fp8", "bf16") == 1.0


def test_model_shape_from_the_settings() -> None:
    shape = ModelShape.of(
        model_bytes=None, model_params=8e9, weight_dtype="bf16", layers=32, kv_heads=8, head_dim=128
    )
    assert (shape.weight_bytes, shape.params, shape.kv_bytes_per_token) == (16e9, 8e9, 131_072)
    assert shape.bytes_per_step(4096) == 16e9 + 4096 * 131_072
    given = ModelShape.of(model_bytes=int(5e9), model_params=None, weight_dtype="int4")
    assert (given.weight_bytes, given.params, given.kv_bytes_per_token) == (5e9, 10e9, None)
    assert given.bytes_per_step(10_000) == 5e9  # no shape: weights only
    assert (
        ModelShape.of(model_bytes=None, model_params=None, weight_dtype="bf16").bytes_per_step(1)
        is None
    )


def test_mbu_and_mfu_formulas() -> None:
    # 8B bf16 with 4096 tokens of KV cache in the batch, 7 ms per step, one H100
    per_step = 16e9 + 4096 * 131_072  # 16.537 GB
    assert mbu(per_step, 0.007, H100_BW) == pytest.approx(0.70518, rel=1e-4)
    # weights alone at 20 ms per step on an A100 (1.555 TB/s): 0.8 TB/s, 51 %
    assert mbu(16e9, 0.020, 1.555e12) == pytest.approx(0.51447, rel=1e-4)
    # 2000 prompt tokens prefilled in 100 ms on an H100 (989 TFLOP/s dense bf16)
    assert mfu(8e9, 2000, 0.1, 989e12) == pytest.approx(0.32356, rel=1e-4)


def test_busy_time_is_the_union_of_intervals() -> None:
    assert busy_time([(0, 2), (1, 3), (5, 6)]) == 4
    assert busy_time([(5, 6), (0, 10)]) == 10
    assert busy_time([]) == 0


def test_decode_estimate_counts_tokens_in_flight_by_littles_law() -> None:
    # Two sequences decoding side by side for the same 2 s, 100 steps of 20 ms, 1000 tokens
    # in each cache on average: every step reads 2000 tokens of KV cache.
    together = decode_estimate([Decode(10, 2.0, 100, 1000), Decode(10, 2.0, 100, 1000)])
    assert together is not None
    assert (together.step_s, together.kv_tokens, together.requests) == (0.02, 2000, 2)
    # The same two one after the other: one sequence in flight at a time.
    apart = decode_estimate([Decode(10, 2.0, 100, 1000), Decode(12, 2.0, 100, 1000)])
    assert apart is not None and apart.kv_tokens == 1000
    # A slow request weighs by its steps: (2 + 1) s / (100 + 100) steps
    mixed = decode_estimate([Decode(10, 2.0, 100, 500), Decode(10, 1.0, 100, 500)])
    assert mixed is not None and mixed.step_s == pytest.approx(0.015)
    assert decode_estimate([]) is None


def stats(
    *,
    tpot: float | None = 0.02,
    output: int = 101,
    prompt: int | None = 950,
    ttft: float | None = 0.2,
    prompt_eval: float | None = None,
) -> RequestStats:
    return RequestStats(
        "chat", "m", Outcome.OK, 200, True, 2.5, ttft, tpot, prompt, output,
        TokenSource.USAGE, output, output - 1, 2.0, 0.04, 0.02, 0, 1.0,
        engine_prompt_eval_s=prompt_eval,
    )  # fmt: skip


def test_the_tracker_keeps_a_window_per_model() -> None:
    tracker = EfficiencyTracker(window_s=60)
    tracker.record("llama", stats(), now=100.0)  # 100 steps of 20 ms, context 950 + 50.5
    tracker.record("llama", stats(tpot=None, output=1), now=100.0)  # no decode phase
    tracker.record("qwen", stats(prompt=None, prompt_eval=0.05), now=130.0)
    decode = tracker.decode(now=150.0)
    assert set(decode) == {"llama", "qwen"}
    assert decode["llama"].step_s == pytest.approx(0.02)
    assert decode["llama"].kv_tokens == pytest.approx(1000.5)
    assert decode["llama"].requests == 1
    assert decode["qwen"].kv_tokens == pytest.approx(50.5)  # unknown prompt: output only
    prefill = tracker.prefill(now=150.0)
    assert set(prefill) == {"llama"}  # qwen's prompt size is unknown
    assert (prefill["llama"].prompt_tokens, prefill["llama"].seconds) == (1900, 0.4)
    assert set(tracker.decode(now=175.0)) == {"qwen"}  # llama's requests aged out
    assert tracker.decode(now=200.0) == {}


def test_the_engine_prefill_time_is_preferred_to_ttft() -> None:
    tracker = EfficiencyTracker()
    tracker.record("m", stats(prompt=1000, ttft=0.5, prompt_eval=0.1), now=0.0)
    assert tracker.prefill(now=1.0)["m"].seconds == 0.1


def test_the_tracker_is_bounded() -> None:
    tracker = EfficiencyTracker(max_records=10)
    for i in range(100):
        tracker.record("m", stats(), now=float(i) / 100)
    assert tracker.decode(now=1.0)["m"].requests == 10
