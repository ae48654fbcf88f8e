"""The metric names the panels query and the thresholds they draw, taken from the catalogue
(``llmobs/export/metrics/catalogue.py``) and the alert rules' defaults
(``llmobs/export/metrics/thresholds.py``): a rename or a new default cannot leave a panel behind.
"""

from __future__ import annotations

from llmobs.export.metrics import catalogue as c
from llmobs.export.metrics import thresholds as t

TTFT = c.TTFT.prometheus
TTFT_PHASE = c.TTFT_PHASE.prometheus
TPOT = c.TPOT.prometheus
DURATION = c.DURATION.prometheus
USAGE = c.TOKEN_USAGE.prometheus
# the newest GenAI conventions' per-direction histograms (OTEL_SEMCONV_STABILITY_OPT_IN)
USAGE_BY_DIRECTION = {"input": c.INPUT_TOKENS.prometheus, "output": c.OUTPUT_TOKENS.prometheus}
TOKENS = c.TOKENS.prometheus
ENGINE_PROMPT_EVAL = c.ENGINE_PROMPT_EVAL.prometheus
ENGINE_LOAD = c.ENGINE_LOAD.prometheus
ITL = c.ITL.prometheus
ITL_SQUARES = c.ITL_SQUARES.prometheus
STALLS = c.STALLS.prometheus
SMOOTHNESS = c.SMOOTHNESS.prometheus
REQUESTS = c.REQUESTS.prometheus
ACTIVE = c.ACTIVE.prometheus
QUEUE = c.QUEUE_DEPTH.prometheus
MALFORMED = c.MALFORMED.prometheus
OBSERVER_ERRORS = c.OBSERVER_ERRORS.prometheus
SPANS_DROPPED = c.SPANS_DROPPED.prometheus
TLS_HANDSHAKES = c.TLS_HANDSHAKES.prometheus
TLS_RELOADS = c.TLS_RELOADS.prometheus
TLS_EXPIRY = c.TLS_EXPIRY.prometheus
WS_SESSIONS = c.WS_SESSIONS.prometheus
WS_ACTIVE = c.WS_ACTIVE.prometheus
WS_DURATION = c.WS_DURATION.prometheus
WS_MESSAGES = c.WS_MESSAGES.prometheus
REALTIME_FIRST_DELTA = c.REALTIME_FIRST_DELTA.prometheus
REALTIME_DELTA_GAP = c.REALTIME_DELTA_GAP.prometheus
REALTIME_TURNS = c.REALTIME_TURNS.prometheus
COLLECTOR_UP = c.COLLECTOR_UP.prometheus
PROCESS_CPU = c.PROCESS_CPU.prometheus
PROCESS_RSS = c.PROCESS_RSS.prometheus
PROCESS_VMS = c.PROCESS_VMS.prometheus
PROCESS_FDS = c.PROCESS_FDS.prometheus
PROCESS_MAX_FDS = c.PROCESS_MAX_FDS.prometheus
PROCESS_START = c.PROCESS_START.prometheus
PYTHON_INFO = c.PYTHON_INFO.prometheus
GC_COLLECTIONS = c.GC_COLLECTIONS.prometheus
GC_COLLECTED = c.GC_COLLECTED.prometheus
GC_UNCOLLECTABLE = c.GC_UNCOLLECTABLE.prometheus
BUILD_INFO = c.BUILD_INFO.prometheus
COLLECTOR_DURATION = c.COLLECTOR_DURATION.prometheus
COLLECTOR_ERRORS = c.COLLECTOR_ERRORS.prometheus
ENGINE_WAITING = c.ENGINE_WAITING.prometheus
ENGINE_RUNNING = c.ENGINE_RUNNING.prometheus
ENGINE_KV_CACHE = c.ENGINE_KV_CACHE.prometheus
PREFIX_HITS = c.ENGINE_PREFIX_HITS.prometheus
PREFIX_QUERIES = c.ENGINE_PREFIX_QUERIES.prometheus
PREFIX_RATIO = c.ENGINE_PREFIX_RATIO.prometheus
SPEC_ACCEPTED = c.ENGINE_SPEC_ACCEPTED.prometheus
SPEC_DRAFTED = c.ENGINE_SPEC_DRAFTED.prometheus
PREEMPTIONS = c.ENGINE_PREEMPTIONS.prometheus
GPU_MEMORY = {
    "used": c.GPU_MEMORY_USED.prometheus,
    "free": c.GPU_MEMORY_FREE.prometheus,
    "total": c.GPU_MEMORY_TOTAL.prometheus,
    "reserved": c.GPU_MEMORY_RESERVED.prometheus,
}
GPU_UTILIZATION = c.GPU_UTILIZATION.prometheus
GPU_MEMORY_CONTROLLER = c.GPU_MEMORY_CONTROLLER.prometheus
GPU_BANDWIDTH_UTILIZATION = c.GPU_BANDWIDTH_UTILIZATION.prometheus
GPU_BANDWIDTH = c.GPU_BANDWIDTH.prometheus
GPU_BANDWIDTH_PEAK = c.GPU_BANDWIDTH_PEAK.prometheus
GPU_POWER = c.GPU_POWER.prometheus
GPU_TEMPERATURE = c.GPU_TEMPERATURE.prometheus
GPU_CLOCK = {"sm": c.GPU_CLOCK_SM.prometheus, "memory": c.GPU_CLOCK_MEMORY.prometheus}
SLO_REQUESTS = c.SLO_REQUESTS.prometheus
COST = c.COST.prometheus
MODEL_INFO = c.MODEL_INFO.prometheus
SLO_MISSES = c.SLO_MISSES.prometheus
SLO_TOKENS = c.SLO_OUTPUT_TOKENS.prometheus
SLO_TARGET = c.SLO_TARGET.prometheus
SLO_WINDOW_SECONDS = c.SLO_WINDOW.prometheus
MBU = c.MBU.prometheus
MFU = c.MFU.prometheus

# Alert defaults (deploy/prometheus/alerts.yml), drawn as thresholds.
TTFT_SLO = t.TTFT_P99_S
ITL_SLO = t.ITL_P99_S
SMOOTHNESS_MIN = t.SMOOTHNESS_MIN
STALLS_PER_1K_MAX = t.STALLS_PER_1K_MAX
FAILURE_RATIO_MAX = t.FAILURE_RATIO_MAX
KV_CACHE_MAX = t.KV_CACHE_MAX
GPU_MEMORY_MAX = t.GPU_MEMORY_MAX
PD_REQUESTS = c.PD_REQUESTS.prometheus
API_REQUESTS = c.API_REQUESTS.prometheus
PD_LEG_DURATION = c.PD_LEG_DURATION.prometheus
PD_LEG_PHASE = c.PD_LEG_PHASE.prometheus
PD_JOINS = c.PD_JOINS.prometheus
PREFILL_BACKLOG = c.PREFILL_BACKLOG.prometheus
PREFILL_BACKLOG_TOKENS = c.PREFILL_BACKLOG_TOKENS.prometheus
PREFILL_BACKLOG_REQUESTS = c.PREFILL_BACKLOG_REQUESTS.prometheus
PREFILL_BUSY = c.PREFILL_BUSY.prometheus
SLO_LATENCY_RATIO = c.SLO_LATENCY_RATIO.prometheus
SLO_BOUND = c.SLO_BOUND.prometheus
