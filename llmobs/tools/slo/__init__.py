"""``llmobs slo`` and ``llmobs why``: two reports read off the same sources.

``samples`` (a sidecar's /metrics text into samples, and whether it is a sidecar's),
``sources`` (the one reading of a sidecar's /metrics over HTTP or of a Prometheus over
PromQL: samples, or ``CannotJudge`` with a sentence), ``attainment`` (``slo``'s figures),
``reasons`` (``why``'s), ``render`` (tables and JSON of both), ``cli`` (their flags and runs).
"""
