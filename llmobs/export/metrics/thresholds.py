"""The alert rules' default thresholds: one source for the rules and the dashboard.

``deploy/generate_rules.py`` writes them into deploy/prometheus/alerts.yml, and the dashboard
(``dashboards/panels/``, through ``names.py``) draws them on the panels they bound;
docs/runbook.md says why each value, and how to change it (edit here, run both generators).
"""

from __future__ import annotations

TTFT_P99_S = 2.0  # 99 % of requests see their first token within this
ITL_P99_S = 0.15  # 99 % of tokens arrive within this of the previous one
STALLS_PER_1K_MAX = 5.0  # stalls per 1000 output tokens
SMOOTHNESS_MIN = 0.8  # token-weighted smoothness of all traffic
MIN_TOKEN_RATE = 1.0  # tokens/s below which a model's stutter is not alerted on (a trickle)
QUEUE_DEPTH_MIN = 10  # requests waiting for their first token, for 5 whole minutes
KV_CACHE_MAX = 0.9  # the engine's KV cache, average over 5 minutes
GPU_MEMORY_MAX = 0.97  # GPU memory used / total
FAILURE_RATIO_MAX = 0.05  # requests the engine failed (refused, reset, 5xx, timeout)
CERTIFICATE_DAYS_MIN = 7  # days before a TLS certificate in use expires
