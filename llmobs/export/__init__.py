"""Export: the consumers of what observation measured.

``metrics`` (the catalogue that names every metric, the families, the text, OpenMetrics and
protobuf encoders, the sink that records a request), ``tracing`` (a request's spans),
``telemetry`` (the providers: Prometheus registry, meters, tracer), ``live`` and ``ui`` (the
live page). Export may import observation and configuration, never the relay or the wire
(import-linter checks it).
"""
