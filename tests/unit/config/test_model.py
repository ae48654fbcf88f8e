"""The model's numeric formats (``config.model``): each size the flags take, and the KV
cache's ``auto``."""

from __future__ import annotations

from llmobs.config.model import DTYPE_BYTES, KV_DTYPES
from llmobs.config.settings import Settings


def test_each_format_has_its_size_and_the_flags_take_it() -> None:
    assert DTYPE_BYTES["bf16"] == 2.0 and DTYPE_BYTES["fp8"] == 1.0 and DTYPE_BYTES["fp4"] == 0.5
    assert all(0 < size <= 4 for size in DTYPE_BYTES.values())
    for dtype in DTYPE_BYTES:
        assert Settings.from_sources({"LLMOBS_WEIGHT_DTYPE": dtype}).weight_dtype == dtype


def test_the_kv_cache_takes_the_activation_type_or_one_of_its_own() -> None:
    assert KV_DTYPES[0] == "auto" and set(KV_DTYPES[1:]) == set(DTYPE_BYTES)
    for dtype in KV_DTYPES:
        assert Settings.from_sources({}, {"kv_dtype": dtype}).kv_dtype == dtype
