"""The tools around the sidecar: ``demo`` (engine, sidecar and load in one command),
``traffic`` (realistic streaming traffic in every dialect: what the demo, compose and
Kubernetes run; not the bench's stamped load, ``llmobs.bench.stamped_load``), ``slo``
(the ``llmobs slo`` gate and ``llmobs why``). They may import every layer; nothing in the
layers imports them.
"""
