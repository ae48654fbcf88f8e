"""Observation: what a response's bytes say, and when, as pure code with time passed in.

``framing`` turns bytes into SSE/NDJSON frames, ``dialects`` frames into token events per API,
``timing`` timestamps into a request's windows and ``StreamStats``, ``stats`` the arithmetic
of gaps, stalls and smoothness, ``labels`` bounded label values, ``slo`` an objective's verdict,
``mbu`` bandwidth and compute use from a request's timing, and ``observer`` the per-request
reader the relay feeds. Observation imports no telemetry library (import-linter checks it);
the observer's hand-over to the metrics sink and the tracer is the one import of ``export``
left, listed in the contracts until the request record replaces it.
"""
