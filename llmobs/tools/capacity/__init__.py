"""``llmobs capacity``: how much a pod serves within its objectives, and what bends the curve.

The stages: a workload of request shapes (``workload``), one load level driven through the
sidecar while its /metrics are read (``drive``), the level's figures from what the clients
saw (``figures``), the search for the knee (``search``), the cause from the sidecar's own
phases and causes (``causes``), and the curve written out (``report``); ``cli`` ties them.
"""
