"""llmobs: an OpenTelemetry observability sidecar for LLM inference servers.

A streaming reverse proxy that relays every byte unchanged while it times every token
(TTFT, inter-token latency, TPOT, stalls, smoothness) and exports Prometheus metrics.
"""

__version__ = "0.1.0"
