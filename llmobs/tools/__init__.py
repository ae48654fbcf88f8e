"""The tools around the sidecar: ``demo`` (engine, sidecar and load in one command), ``load``
(the streaming load generator the demo, compose and Kubernetes run), ``slo_report`` (the
``llmobs slo`` gate). They may import every layer; nothing in the layers imports them.
"""
