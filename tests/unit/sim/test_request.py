"""A sequence inside the sim (``sim.request``): its tokens as the engine puts them, the end of
the engine told to whoever waits, and the vocabulary's ids."""

from __future__ import annotations

import pytest

from llmobs.sim.request import (
    EOS_TOKEN,
    EOS_TOKEN_ID,
    TOKENS,
    EngineStopped,
    RequestState,
    SimRequest,
    token_id,
)


async def test_tokens_come_out_in_the_order_the_engine_puts_them() -> None:
    request = SimRequest(seq=3, prompt_tokens=8, tokens=(" a", " b"), finish_reason="stop")
    assert (request.state, request.completion_tokens, request.generated) == (
        RequestState.WAITING, 2, 0)  # fmt: skip
    request.emit(" a")
    request.emit(" b")
    assert [await request.next_token(), await request.next_token()] == [" a", " b"]


async def test_a_stopped_engine_ends_the_wait() -> None:
    request = SimRequest(seq=0, prompt_tokens=1, tokens=(" a",), finish_reason="stop")
    request.stop()
    with pytest.raises(EngineStopped):
        await request.next_token()


def test_every_token_has_an_id_past_the_special_ones() -> None:
    ids = [token_id(t) for t in TOKENS]
    assert len(set(ids)) == len(TOKENS) and min(ids) >= 100
    assert all(t.startswith(" ") and t.strip() for t in TOKENS)
    assert token_id(EOS_TOKEN) == EOS_TOKEN_ID < 100
