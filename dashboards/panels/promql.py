"""The PromQL every row shares: the pods and models chosen on the dashboard, rates, quantiles
from native histograms with the classic buckets as fallback, and the streams' derived figures
(ITL mean and spread, smoothness, stall and failure rates, the SLO's bad share and budget).
"""

from __future__ import annotations

from llmobs.export.metrics import catalogue as c
from panels.names import ITL, ITL_SQUARES, REQUESTS, SLO_REQUESTS, SLO_TARGET, STALLS

POD = 'namespace=~"$namespace", job=~"$job", pod=~"$pod"'
MODEL = POD + ', gen_ai_request_model=~"$model"'
RATE_INTERVAL = "$__rate_interval"
SLO_WINDOW = "$slo_window"  # a range chosen on the dashboard (default 28d: --slo-window's)
FAILED = 'outcome=~"upstream_error|upstream_timeout"'

# the histograms the sidecar also exposes as native ones
NATIVE = frozenset(m.prometheus for m in c.CATALOGUE if m.native is not None)


def rate(metric: str, selector: str = MODEL, fn: str = "rate") -> str:
    """A counter's (or histogram series') per-second rate over Grafana's rate interval."""
    return f"{fn}({metric}{{{selector}}}[{RATE_INTERVAL}])"


def quantile(q: float, histogram: str, selector: str = MODEL, by: str = "") -> str:
    """From the native histogram where Prometheus has one (a few percent from the exact
    quantile), else from the classic buckets (docs/metrics.md); per ``by`` labels if any."""
    classic_by = f"le, {by}" if by else "le"
    classic = (
        f"histogram_quantile({q}, sum by ({classic_by}) ({rate(histogram + '_bucket', selector)}))"
    )
    if histogram not in NATIVE:
        return classic
    group = f"sum by ({by}) " if by else "sum"
    return f"histogram_quantile({q}, {group}({rate(histogram, selector)})) or {classic}"


def total(metric: str, selector: str = MODEL) -> str:
    """The rate summed over every series chosen: the fleet's, a job's or a pod's figure."""
    return f"sum({rate(metric, selector)})"


def native_total(part: str, histogram: str, selector: str = MODEL, by: str = "") -> str:
    """The rate of a histogram's count or sum (``part``), from the native histogram where
    Prometheus keeps only that (2.40-2.44), else from the classic series; per ``by``."""
    group = f"sum by ({by}) " if by else "sum"
    native = f"{group}(histogram_{part}({rate(histogram, selector)}))"
    return f"({native} or {group}({rate(f'{histogram}_{part}', selector)}))"


ITL_COUNT = native_total("count", ITL)
ITL_SUM = native_total("sum", ITL)
ITL_MEAN = f"{ITL_SUM} / {ITL_COUNT}"
ITL_STDDEV = f"sqrt(clamp_min({total(ITL_SQUARES)} / {ITL_COUNT} - ({ITL_MEAN}) ^ 2, 0))"
SMOOTH_TOKENS = f"{ITL_SUM} ^ 2 / ({ITL_COUNT} * {total(ITL_SQUARES)})"
STALLS_PER_1K = f"1000 * ({total(STALLS)} or vector(0)) / {ITL_COUNT}"
FAILURE_RATIO = f"({total(REQUESTS, MODEL + ', ' + FAILED)} or vector(0)) / {total(REQUESTS)}"
OK_REQUESTS = MODEL + ', outcome="ok"'
OUTPUT = '"output"'
STALLS_PER_REQUEST = f"({total(STALLS)} or vector(0)) / {total(REQUESTS, OK_REQUESTS)}"


def bad_ratio(window: str, by: str = "gen_ai_request_model") -> str:
    """The share of judged requests that were bad over ``window``, per ``by`` (""; all)."""
    group = f"sum by ({by}) " if by else "sum "
    bad = f'{group}(increase({SLO_REQUESTS}{{{MODEL}, verdict="bad"}}[{window}]))'
    judged = f"{group}(increase({SLO_REQUESTS}{{{MODEL}}}[{window}]))"
    return f"{bad} / ({judged} > 0)"  # a model with none judged has no share, not 0/0


SLO_BUDGET = f"(1 - max by (gen_ai_request_model) ({SLO_TARGET}{{{MODEL}}}))"
