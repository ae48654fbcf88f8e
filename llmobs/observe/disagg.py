"""One request, two pods: the roles of disaggregated prefill and decode, and the join of a
user's request with the legs it became.

Under disaggregated serving (vLLM's NixlConnector as llm-d's routing sidecar, vLLM's toy
proxy, Dynamo drive it) a user's request reaches the decode pod's routing sidecar with the
prefill pod's address in a header (``x-prefiller-host-port``, or ``x-prefiller-url``); the
sidecar sends a *prefill leg* to that pod (``kv_transfer_params.do_remote_decode: true``,
one token, not streamed), then a *decode leg* to its own engine with the parameters the
prefill answered (``do_remote_prefill: true``, the remote engine's id, its block ids). Each
request's role is read from what it carries (``role_of``: pure); a leg is never a user's
request (it is counted in families of its own) and a claim is believed only in the shape
vLLM gives it (a prefill leg's also only when its engine answered with the parameters).

The join: the routing sidecar copies the user's request's headers onto both legs, so the
``traceparent`` the pod's entry forwarded comes back on them. A user's request waits under
that context from the moment it goes upstream (``PdJoin.wait``) to its end (``PdJoin.take``);
a leg that passes through this process meanwhile attaches what it knows to it
(``PdJoin.post``): when its decode leg arrived (the end of ``remote_prefill``), what the
prefill engine reported. A leg finds its request waiting or never will (it cannot come before
its request went upstream): one that finds none is counted (``orphaned``) and kept nowhere,
so what the join holds is bounded by the requests in flight, and a client sending legs under
contexts of its own cannot push a real request's legs out. Pure: times are arguments.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from typing import Any

from llmobs.observe.phases import TtftPhases

PREFILLER_HEADERS = ("x-prefiller-host-port", "x-prefiller-url")  # llm-d's, old and new
_HOST_PORT, _URL = PREFILLER_HEADERS
MAX_WAITING = 65_536  # users' requests in flight whose legs may join them
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


class PdRole(enum.StrEnum):
    """What a request is in disaggregated serving (a label value: a closed set)."""

    WHOLE = "whole"  # served whole by one engine (no P/D, or a plain pod)
    DISAGGREGATED = "disaggregated"  # a user's request whose prefill is remote
    PREFILL_LEG = "prefill_leg"  # the prefill pod's part of one
    DECODE_LEG = "decode_leg"  # the decode engine's part, behind the routing sidecar
    LOCAL_LEG = "local_leg"  # a request the routing sidecar handed its engine whole


LEGS = frozenset({PdRole.PREFILL_LEG, PdRole.DECODE_LEG, PdRole.LOCAL_LEG})


class Claim(enum.IntEnum):
    """What a body's ``kv_transfer_params`` claim, in vLLM's shape or not at all."""

    NONE = 0
    PREFILL = 1  # do_remote_decode: true
    DECODE = 2  # do_remote_prefill: true, the remote engine's id and block ids


class Position(enum.StrEnum):
    """Where a listener stands: at the pod's entry (or in front of any engine: each request
    a user's or a leg by what it carries), or behind the routing sidecar in front of the
    decode engine (every request there a leg: its user's was counted at the entry)."""

    ENTRY = "entry"
    DECODE = "decode"


def claim_of(params: Any) -> Claim:
    """The role a body's ``kv_transfer_params`` claims; anything else than vLLM's shape
    (wrong types, a string, a list) claims nothing. Never walks the block ids: a huge list
    costs nothing here."""
    if not isinstance(params, dict):
        return Claim.NONE
    if params.get("do_remote_decode") is True:
        return Claim.PREFILL
    if (
        params.get("do_remote_prefill") is True
        and isinstance(params.get("remote_engine_id"), str)
        and isinstance(params.get("remote_block_ids"), list)
    ):
        return Claim.DECODE
    return Claim.NONE


def has_prefiller(headers: Mapping[str, str]) -> bool:
    """Whether the scheduler sent this request's prefill to another pod (llm-d's header)."""
    get = headers.get  # on every request's path: two lookups, no generator
    found = get(_HOST_PORT) or get(_URL)
    return bool(found and found.strip())


def role_of(position: Position, prefiller: bool, claim: Claim) -> PdRole:
    """A request's role from where it arrived and what it carries."""
    if position is Position.DECODE:
        return PdRole.DECODE_LEG if claim is Claim.DECODE else PdRole.LOCAL_LEG
    if claim is Claim.PREFILL:
        return PdRole.PREFILL_LEG
    if claim is Claim.DECODE:
        return PdRole.DECODE_LEG
    return PdRole.DISAGGREGATED if prefiller else PdRole.WHOLE


def confirmed(role: PdRole, status: int, answered_params: bool) -> PdRole:
    """A prefill leg's claim, held against its answer: an engine that answered 2xx without
    ``kv_transfer_params`` does no P/D (a client claimed it): the request was a user's."""
    if role is PdRole.PREFILL_LEG and 200 <= status < 300 and not answered_params:
        return PdRole.WHOLE
    return role


def context_key(traceparent: str | None) -> tuple[str, str] | None:
    """(trace id, parent span id) of a W3C ``traceparent``; None when absent or malformed
    (what a hostile header gives: no join, never an error)."""
    if traceparent is None or len(traceparent) != 55:
        return None
    found = _TRACEPARENT.fullmatch(traceparent.lower())
    if found is None or found.group(1) == _ZERO_TRACE or found.group(2) == _ZERO_SPAN:
        return None
    return found.group(1), found.group(2)


class Leg:
    """What a leg tells its user's request: when it arrived here, and what its engine
    reported of its queue and prefill (a prefill leg's; filled at its end)."""

    __slots__ = ("arrived_ns", "prefill_s", "queue_s", "role")

    def __init__(self, role: PdRole, arrived_ns: int) -> None:
        self.role = role
        self.arrived_ns = arrived_ns
        self.queue_s: float | None = None
        self.prefill_s: float | None = None


class PdJoin:
    """The users' requests in flight that their legs may join, by the trace context each
    forwarded; ``capacity`` of them at most (past it a request waits for none)."""

    __slots__ = ("_waiting", "capacity", "joined", "missing", "orphaned")

    def __init__(self, capacity: int = MAX_WAITING) -> None:
        # each waiting request's legs: [prefill, decode], None until one comes
        self._waiting: dict[tuple[str, str], list[Leg | None]] = {}
        self.capacity = capacity
        self.joined = 0  # users' requests that found their decode leg
        self.missing = 0  # users' requests that ended with none (the leg never came)
        self.orphaned = 0  # legs no waiting request took (it ended first, or was elsewhere)

    def __len__(self) -> int:
        return len(self._waiting)

    def wait(self, key: tuple[str, str]) -> None:
        """A user's request went upstream with ``key``: its legs may come."""
        if len(self._waiting) < self.capacity:
            self._waiting[key] = [None, None]

    def post(self, key: tuple[str, str], role: PdRole, arrived_ns: int) -> Leg:
        """A leg under ``key``: attached to its request if it waits (the later of two legs of
        one role replaces the earlier, an orphan then), counted an orphan if not; returns it,
        for its end to fill in."""
        leg = Leg(role, arrived_ns)
        legs = self._waiting.get(key)
        if legs is None:
            self.orphaned += 1
            return leg
        slot = 1 if role is PdRole.DECODE_LEG else 0
        if legs[slot] is not None:
            self.orphaned += 1
        legs[slot] = leg
        return leg

    def take(self, key: tuple[str, str]) -> tuple[Leg | None, Leg | None]:
        """The user's request under ``key`` ended: its prefill and decode legs (None: not
        seen here); it waits no longer."""
        prefill, decode = self._waiting.pop(key, None) or (None, None)
        if decode is None:
            self.missing += 1
        else:
            self.joined += 1
        return prefill, decode

    def discard(self, key: tuple[str, str]) -> None:
        """The request waits no longer, whatever happened (counted by ``take`` only)."""
        self._waiting.pop(key, None)


def split_disaggregated(
    ttft_ns: int,
    before_ns: int,
    remote_ns: int | None,
    prefill: Leg | None = None,
    transfer_s: float | None = None,
    first_decode_s: float | None = None,
) -> TtftPhases:
    """A disaggregated request's TTFT in phases that sum to it exactly: ``before_ns``
    measured at the entry; ``remote_ns`` measured from its forwarding to its decode leg's
    arrival (None: the leg passed elsewhere), within which the prefill engine's own queue
    and prefill (``prefill``: its leg, if seen here and reported) are cut out; the decode
    engine's reported wait (``transfer_s``) and first step (``first_decode_s``); ``other``
    the rest. Each part is cut to what is left, in that order, so none is ever negative."""
    left = max(ttft_ns, 0)
    before = min(max(before_ns, 0), left)
    left -= before
    queue = prefill_ns = remote = None
    if remote_ns is not None:
        gap = min(max(remote_ns, 0), left)
        left -= gap
        if prefill is not None:
            queue, gap = _cut(prefill.queue_s, gap)
            prefill_ns, gap = _cut(prefill.prefill_s, gap)
        remote = gap
    transfer, left = _cut(transfer_s, left)
    first, left = _cut(first_decode_s, left)
    return TtftPhases(before, None, queue, prefill_ns, left, remote, transfer, first)


def leg_phases(
    total_ns: int, before_ns: int, role: PdRole, queue_s: float | None, prefill_s: float | None
) -> TtftPhases:
    """A leg's own phases over ``total_ns`` (a decode leg's time to its first token, a
    prefill leg's whole answer): its engine's queue and prefill as reported; for a decode
    leg they are the wait for the KV cache and the first decode step."""
    left = max(total_ns, 0)
    before = min(max(before_ns, 0), left)
    left -= before
    queue, left = _cut(queue_s, left)
    prefill, left = _cut(prefill_s, left)
    if role is PdRole.DECODE_LEG:
        return TtftPhases(before, None, None, None, left, None, queue, prefill)
    return TtftPhases(before, None, queue, prefill, left)


def _cut(seconds: float | None, left: int) -> tuple[int | None, int]:
    """A reported phase in whole nanoseconds, no longer than what is ``left``; and what is
    left after it."""
    if seconds is None:
        return None, left
    ns = min(max(round(seconds * 1e9), 0), left)
    return ns, left - ns


class PdSettings:
    """A listener's part in P/D: where it stands, whether roles are read at all
    (``--pd-roles``), whether a body's claim of a leg's role is believed (not at a decode
    pod's entry: every request there is a user's, so none can hide as a leg), the join its
    requests share (None: no listener of this process sees decode legs), and the source of
    the trace contexts an untraced request is given for its legs to be joined by (``ids``:
    64 random bits a call)."""

    __slots__ = ("claims", "ids", "join", "on", "position")

    def __init__(
        self,
        position: Position = Position.ENTRY,
        on: bool = True,
        join: PdJoin | None = None,
        ids: Callable[[], int] | None = None,
        claims: bool = True,
    ) -> None:
        self.position = position
        self.on = on
        self.join = join
        self.ids = ids
        self.claims = claims


class PdRequest:
    """One request's part in P/D: its role (from where it arrived, its headers, its body,
    its answer), its trace context as the join knows it, and its TTFT in the phases of two
    pods. Made only for a request that has a part (``pd_request``): a plain pod's requests
    pay nothing."""

    __slots__ = (
        "_arrived_ns", "_client", "_flags", "_settings", "_waits", "key", "prefiller", "role",
    )  # fmt: skip

    def __init__(
        self, settings: PdSettings, prefiller: bool, traceparent: str | None, arrived_ns: int
    ) -> None:
        self._settings = settings
        self.prefiller = prefiller
        self._arrived_ns = arrived_ns
        # a leg's key is the context it arrived with; a user's request's, the one it forwards
        self._client = context_key(traceparent)
        # its client's trace flags, kept on a context made for it (sampled or not)
        self._flags = traceparent[-2:].lower() if self._client and traceparent else "00"
        self.key = self._client if settings.position is Position.DECODE else None
        self._waits = False  # a user's request waiting in the join for its legs
        self.role = role_of(settings.position, prefiller, Claim.NONE)

    def claimed(self, claim: Claim) -> None:
        """The body's ``kv_transfer_params`` say what it is (if they are believed here)."""
        settings = self._settings
        if not settings.claims:
            return
        self.role = role_of(settings.position, self.prefiller, claim)
        if self.role is PdRole.PREFILL_LEG and settings.position is Position.ENTRY:
            self.key = self._client

    @property
    def leg(self) -> bool:
        """Whether it is a leg: never counted as a user's request."""
        return self.role in LEGS

    def inject(self, carrier: dict[str, str] | Any) -> None:
        """The user's request goes upstream: its key is the context it carries (its span's,
        when traced), else one made for it, continuing the client's trace when it sent one;
        it waits in the join for its legs from now."""
        settings = self._settings
        join = settings.join
        # only at a decode pod's entry, where no body is believed: a request elsewhere (a
        # prefill leg whose router copied the prefiller header onto it) may turn out a leg
        # once its body is read, after its context went upstream
        if self.role is not PdRole.DISAGGREGATED or join is None or settings.claims:
            return
        key = context_key(carrier.get("traceparent"))
        ids = settings.ids
        if key is None and ids is not None:
            client, flags = self._client, self._flags
            trace_id = client[0] if client else format(ids() << 64 | ids(), "032x")
            key = (trace_id, format(ids() or 1, "016x"))
            carrier["traceparent"] = f"00-{key[0]}-{key[1]}-{flags}"
        self.key = key
        if key is not None:
            join.wait(key)
            self._waits = True

    def forwarded(self) -> None:
        """A decode leg is on its way to its engine: it joins its user's request now."""
        join = self._settings.join
        if self.role is PdRole.DECODE_LEG and self.key is not None and join is not None:
            join.post(self.key, self.role, self._arrived_ns)

    def finished(
        self, status: int, answered: bool, queue_s: float | None, prefill_s: float | None
    ) -> None:
        """The request ended: a prefill leg's claim held against its answer, and a prefill
        leg's report handed to its user's request (which ends after it)."""
        self.role = confirmed(self.role, status, answered)
        join = self._settings.join
        if self.role is PdRole.PREFILL_LEG and self.key is not None and join is not None:
            leg = join.post(self.key, self.role, self._arrived_ns)
            leg.queue_s, leg.prefill_s = queue_s, prefill_s

    def phases(
        self, times: tuple[int, int | None, int | None, int], queue_s: float | None,
        prefill_s: float | None,
    ) -> TtftPhases | None:  # fmt: skip
        """Its TTFT in phases (a leg's: its own time to first token, or its whole answer's);
        ``times``: (arrival, forwarded, first token, end) on the relay's clock."""
        start, forwarded, first, end = times
        before = forwarded - start if forwarded is not None else 0
        if self.leg:
            total = (first if first is not None else end) - start
            return leg_phases(total, before, self.role, queue_s, prefill_s)
        prefill = decode = None
        join = self._settings.join  # taken whatever its end: the join keeps nothing of it
        if self._waits and self.key is not None and join is not None:
            self._waits = False
            prefill, decode = join.take(self.key)
        if first is None:
            return None
        remote = None
        if decode is not None and forwarded is not None:
            remote = decode.arrived_ns - forwarded
        return split_disaggregated(first - start, before, remote, prefill, queue_s, prefill_s)

    def release(self) -> None:
        """The request's end, whatever failed before: it waits in the join no longer."""
        join = self._settings.join
        if self._waits and self.key is not None and join is not None:
            self._waits = False
            join.discard(self.key)


def pd_request(
    settings: PdSettings | None, prefiller: bool, traceparent: str | None, arrived_ns: int,
    claim: Claim = Claim.NONE,
) -> PdRequest | None:  # fmt: skip
    """A request's part in P/D, if it has one from what it showed so far: behind the routing
    sidecar, sent with a prefiller, or claiming a leg's role in its body where claims are
    believed; None: none (a plain pod's request, or ``--pd-roles off``)."""
    if settings is None or not settings.on:
        return None
    believed = claim is not Claim.NONE and settings.claims
    if settings.position is Position.ENTRY and not prefiller and not believed:
        return None
    request = PdRequest(settings, prefiller, traceparent, arrived_ns)
    if claim is not Claim.NONE:
        request.claimed(claim)
    return request
