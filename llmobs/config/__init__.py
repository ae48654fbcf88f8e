"""Configuration, read once: each option declared once (``options``: flag, variable, default,
parser, and its check from ``checks``), the sidecar's frozen ``Settings`` (``settings``, the
only reader of ``LLMOBS_*``), the standard ``OTEL_*`` variables (``otel``), and log set-up
(``logs``). Every layer may import it.
"""
