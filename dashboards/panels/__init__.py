"""The main Grafana dashboard's parts, one module a row (overview, slo, experience, why,
tenants, load, errors, gpu, health) over what they share: the metric names and thresholds
(names), the PromQL (promql), the panel kinds (builders), the variables; board assembles them.
``python dashboards/generate.py`` writes the result to dashboards/llmobs.json.
"""
