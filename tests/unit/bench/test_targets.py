"""What the bench measures against (``bench.targets``): the CPUs each party is pinned to."""

from __future__ import annotations

from llmobs.bench.targets import plan_pinning


def test_plan_pinning() -> None:
    assert plan_pinning([0, 1]).describe() == "engine cpu 0, client cpu 0, target cpu 1"
    three = plan_pinning([0, 1, 2, 3])
    assert (three.engine, three.client, three.target) == (
        frozenset({0}),
        frozenset({1}),
        frozenset({2}),
    )
    assert plan_pinning([0]).target is None
    assert plan_pinning([0, 1], enabled=False).engine is None
