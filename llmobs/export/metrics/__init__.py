"""Metrics: the catalogue that names them, the series that hold them, their exposition.

- ``catalogue``: every metric's name, unit, buckets and labels (the one source; dashboards and
  alert rules take names from it);
- ``series``: the families, the only code that knows a series' layout;
- ``exposition``: /metrics as bytes;
- ``sink``: a finished request into the series (``MetricsSink``);
- ``otel``: the same into OpenTelemetry instruments, when metrics are pushed over OTLP.
"""
