"""Observation: what a response's bytes say, and when, as pure code with time passed in.

``observer`` is the per-request object the relay feeds: its ``reader`` takes each read of the
body through ``framing`` (bytes into SSE/NDJSON frames) and ``dialects`` (frames into token
events per API) to the ``clock`` (when each choice's output came; a ``timing.StreamTimer``
each), and at the end the ``recorder`` makes one ``record.RequestRecord``: ``RequestStats``
and the last ``window``s (``stats``: the arithmetic of gaps, stalls and smoothness), the
``slo`` verdict, the model's bounded label (``labels``), and delivers it to every consumer.
``mbu`` is the bandwidth and compute arithmetic of finished requests. Observation imports no
telemetry library and nothing of export or the collectors: it knows its consumers only as the
shapes in ``record`` (import-linter checks it).
"""
