"""Metrics: the catalogue that names them, the series that hold them, their exposition.

- ``catalogue``: every metric's name, unit, buckets and labels (the one source; dashboards and
  alert rules take names from it);
- ``series``: the families, the only code that knows a series' layout; they hold the values
  and give them at a scrape as frames (``frames``: the neutral family model);
- ``text``, ``openmetrics``, ``protobuf``: the encoders, frames into each format's bytes
  (``client_model``: the protobuf messages);
- ``exposition``: /metrics as bytes, in the format negotiated;
- ``sink``: a finished request's record into the series (``MetricsSink``, a consumer);
- ``otel``: the same into OpenTelemetry instruments, when metrics are pushed over OTLP
  (``OtelMetrics``, another consumer);
- ``totals``: the series read for the live page; ``query``: a registry read as PromQL would.
"""
