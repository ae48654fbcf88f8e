"""The model's numeric formats, as the flags name them (``--weight-dtype``, ``--kv-dtype``):
declared here so that settings can check a value and ``llmobs.observe.mbu`` can price it."""

from __future__ import annotations

# Bytes per parameter (or per KV element). 4-bit formats ignore their scales (a few %).
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5,
}  # fmt: skip
KV_DTYPES = ("auto", *DTYPE_BYTES)
