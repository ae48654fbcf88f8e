"""The bench's cells (``bench.runner``): the pace a cell offers, and the sim it starts, whose
flags the sim's own parser must take."""

from __future__ import annotations

import argparse

from llmobs.bench.runner import BenchOptions, sim_flags, tpot_for
from llmobs.sim import add_sim_arguments, sim_settings_from_args


def test_the_pace_is_stretched_to_the_rate_cap() -> None:
    options = BenchOptions(tpot=0.01, max_paced_rate=5000.0)
    assert tpot_for(options, 16) == 0.01  # under the cap
    assert tpot_for(options, 512) == 512 / 5000.0  # stretched


def test_the_sim_flags_make_a_fixed_schedule() -> None:
    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    flags = sim_flags(BenchOptions(model="m"), 0.02, 64, 16)
    settings = sim_settings_from_args(parser.parse_args(flags), {})
    assert (settings.model, settings.max_batch, settings.decode_base) == ("m", 64, 0.02)
    assert (settings.prefill_base, settings.prefill_per_token, settings.decode_per_seq) == (0, 0, 0)
    assert (settings.output_tokens_min, settings.output_tokens_max) == (16, 16)
    assert (settings.stall_every, settings.fault) == (0, "header")
