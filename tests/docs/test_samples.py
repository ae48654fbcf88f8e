"""Each sample output in README.md and docs/ has the shape of what its command prints today:
the recipe (tests/docs/samples.py) runs shortened, and its lines, numbers and ids aside, must
be the sample's. `python -m tests.docs.samples` writes fresh samples."""

from __future__ import annotations

import pytest

from tests.docs.samples import RECIPES, sample_blocks, shape

SAMPLES = sample_blocks()


def test_every_sample_has_a_recipe() -> None:
    assert set(SAMPLES) == set(RECIPES)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_sample_has_the_shape_of_the_commands_output(name: str) -> None:
    block = SAMPLES[name]
    output = RECIPES[name](True)
    assert shape(block.code) == shape(output), (
        f"{block.name} no longer looks like what its command prints: run "
        f"`python -m tests.docs.samples {name}` to write it anew.\n--- now ---\n{output}"
    )


def test_shape_keeps_what_a_reader_reads() -> None:
    """Numbers and ids go; a field added, renamed or dropped does not."""
    sample = "  requests   56   (56 ok, 0 failed at client)\n    llmobs.stalls = 2\n"
    assert shape(sample) == shape(sample.replace("56", "107").replace("2", "5"))
    assert shape(sample) != shape(sample.replace("llmobs.stalls", "llmobs.stall_count"))
    assert shape(sample) != shape(sample + "    llmobs.slo.verdict = 'good'\n")


def test_shape_takes_the_order_of_causes_out() -> None:
    """`llmobs why` ranks causes by their share, which a shorter run may rank otherwise."""
    one = "  stalls (134): 52% engine pauses, 48% prefill interference\n"
    assert shape(one) == shape("  stalls (9): 60% prefill interference, 40% engine pauses\n")
    assert shape(one) == shape("  stalls (0): -\n")
    assert shape(one) == shape("  stalls (9): 100% engine pauses, <1% client\n")
    assert shape(one) != shape(one.replace("stalls", "stall causes"))
