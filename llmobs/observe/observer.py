"""Per request: the stream reader, the request clock, the record and its consumers.

The proxy calls into an ``Observer`` at each stage of a request, always after the bytes have
gone to the client: the request body (model, stream), forwarded, the response head, each read
of the body (straight into the ``StreamReader``, which tells the ``RequestClock``), the end.
Any exception inside observation is swallowed, counted (``llmobs.observer.errors``) and logged
once per request, and observation of that request stops: the relay itself never sees it.
``finish()`` is idempotent, so whichever way a request ends (normally, client gone, upstream
broken, cancelled) exactly one outcome is recorded, in one ``RequestRecord`` that the sink and
then each consumer take.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass

from llmobs.observe.causes import EngineTimeline, Stall, stall_gaps
from llmobs.observe.clock import RequestClock
from llmobs.observe.dialects import OTHER_ROUTE, Route
from llmobs.observe.dialects.base import ABORTED, ERROR, NONE, Dialect
from llmobs.observe.dialects.grpc import (
    STATUS_OK,
    GrpcDialect,
    ModelInfoReply,
    ServedModel,
    http_status,
    status_of,
)
from llmobs.observe.dialects.request import NO_BODY, parse_grpc_request, parse_request, truncate
from llmobs.observe.disagg import Claim, PdRequest, PdRole, PdSettings, Position, pd_request
from llmobs.observe.phases import TtftPhases
from llmobs.observe.provider import Provider
from llmobs.observe.reader import StreamReader
from llmobs.observe.record import RequestRecord, TraceHandle, TraceRef
from llmobs.observe.recorder import Recorder
from llmobs.observe.saturation import Backlogs, PrefillBacklog
from llmobs.observe.timing import Outcome, RequestStats, TokenSource, finish_request
from llmobs.observe.window import TokenWindow

# the stalls of one request judged, and kept on its record (the rest count as unknown):
# a pathological stream's judging stays bounded
MAX_STALLS = 256
# enum members as module constants: reading one off its class costs a lookup through the
# enum's metaclass, ~0.1 µs, and these are read on every request's path
_NO_CLAIM, _WHOLE, _DECODE = Claim.NONE, PdRole.WHOLE, Position.DECODE
_PREFILL_LEG, _OK = PdRole.PREFILL_LEG, Outcome.OK
TRAIL_TIMES = 4096  # the chunk times an ended request leaves on the engine's timeline


@dataclass(frozen=True, slots=True)
class ObserveSettings:
    """The observation knobs, taken from the sidecar's Settings once."""

    stall_factor: float = 3.0
    stall_min_gap: float = 0.05
    max_line_bytes: int = 1 << 20
    capture_content: bool = False
    # the gen_ai.provider.name, told the dialect of each request the engine answered with a
    # 2xx until it is settled (an engine's own API names the engine: observe.provider)
    provider: Provider | None = None
    # the listener's part in disaggregated prefill and decode (None: roles not read)
    pd: PdSettings | None = None
    # the sidecar's prefill backlogs, shared by its listeners (None: not measured)
    backlogs: Backlogs | None = None
    # the model an engine's gRPC API serves, learned from its GetModelInfo answers
    served: ServedModel | None = None


class Observer:
    """Observation of one proxied request."""

    __slots__ = (
        "_backlog",
        "_clock",
        "_config",
        "_finished",
        "_labels",
        "_live",
        "_reader",
        "_recorder",
        "_sink",
        "_size",
        "_stalls",
        "_tenant",
        "_timeline",
        "_trace",
        "_traceparent",
        "chunk",
        "grpc_status",
        "info",
        "operation",
        "pd",
        "route",
        "status",
        "waits",
    )

    def __init__(
        self,
        recorder: Recorder,
        config: ObserveSettings,
        route: Route,
        start_ns: int,
        trace: TraceHandle | None = None,
        timeline: EngineTimeline | None = None,
        tenant: str | None = None,
        prefiller: bool = False,
        traceparent: str | None = None,
    ) -> None:
        """``recorder``: where the request's record is made and delivered (its sink counts
        the request live); ``timeline``: the engine's streams, shared by every request,
        against which a stall is judged (``causes``); ``tenant``: whose request it is
        (``tenants.tenant_of``), labelled at its end if tenants are; ``prefiller``,
        ``traceparent``: what its headers say of its part in P/D (``disagg``)."""
        self._recorder = recorder
        sink = self._sink = recorder.sink
        self._tenant = tenant
        self._timeline = timeline
        self._stalls: list[Stall] | None = None  # those of windows taken mid-stream
        self._trace = trace
        self._config = config
        # its model's and tenant's labels, once admitted at a 2xx/3xx head (None: not yet)
        self._labels: tuple[str, str] | None = None
        self.status = 0
        self.grpc_status: int | None = None  # a gRPC call's, from its trailers
        self._finished = False
        # its part in P/D (None: none, as a plain pod's requests; ``disagg``)
        pd = config.pd
        self.pd: PdRequest | None = None
        self._live = True  # counted live (in flight), unless a leg behind the routing sidecar
        if pd is not None and (prefiller or pd.position is _DECODE):
            self.pd = pd_request(pd, prefiller, traceparent, start_ns)
            self._live = self.pd is None or not self.pd.leg  # (its user's counted at the entry)
        self._traceparent = traceparent
        # the prefill backlog it waits in, by its role, and its body's size (``saturation``)
        self._backlog: PrefillBacklog | None = None
        self._size = 0
        self.waits = False  # a prefill leg not streamed, in the backlog until its answer
        # positional arguments: a class called with keywords builds a dict of them
        clock = self._clock = RequestClock(
            start_ns, self._window_full, config.stall_factor, config.stall_min_gap
        )
        self._reader = StreamReader(clock, route.dialect(), sink, config.max_line_bytes)
        self.route = route
        self.operation = route.operation
        self.info = NO_BODY[route.always_streams]
        if config.capture_content:
            self._reader.dialect.captured = []
        # each read of the body goes straight to the reader (``RequestObserver.chunk``)
        self.chunk: Callable[[int, bytes], None] = self._reader.chunk
        if self._live:
            sink.request_started()

    def _use(self, route: Route) -> None:
        """Measure the request as ``route`` after all: its operation and a new dialect."""
        self.route = route
        self.operation = route.operation
        self.info = NO_BODY[route.always_streams]
        self._reader.use(route.dialect())
        if self._config.capture_content:
            self._reader.dialect.captured = []

    def _fail(self, where: str) -> None:
        """Count an internal error, log it once, stop observing this request."""
        self._reader.fail(where)

    def request_body(self, body: bytes) -> None:
        """The request body as forwarded (JSON bodies only); parsed for model and stream."""
        try:
            confirm = self.route.confirm
            if confirm is not None and confirm not in body:  # not the route's API after all
                self._use(OTHER_ROUTE)
            self._size = len(body)
            route = self.route
            if route.grpc:
                self.info = parse_grpc_request(body, route, self._config.served)
            else:
                self.info = parse_request(body, route, self._config.capture_content)
            if self.info.claim is not _NO_CLAIM or self.pd is not None:
                self._claimed(self.info.claim)
        except Exception:
            self._fail("request_body")

    def _claimed(self, claim: Claim) -> None:
        """The body claims a role in P/D (or the request already has a part): its role. A
        request its body made a leg leaves the live counts at once (a leg is no user's)."""
        pd = self.pd
        if pd is None:
            start = self._clock.start_ns
            pd = self.pd = pd_request(self._config.pd, False, self._traceparent, start, claim)
        elif claim is not _NO_CLAIM:
            pd.claimed(claim)
        if pd is not None and pd.leg and self._live:
            self._live = False
            self._sink.request_ended()

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Add this request's trace context to the upstream request, when tracing (or a
        context of its own, for a disaggregated request's legs to be joined by)."""
        if self._trace is not None:
            self._guard("inject", self._trace.inject, headers)
        if self.pd is not None:
            self._guard("inject", self.pd.inject, headers)

    def forwarded(self, t_ns: int) -> None:
        """The request went upstream: a streaming request now waits for its first token."""
        self._clock.forwarded_ns = t_ns
        try:
            pd = self.pd
            if pd is not None:
                pd.forwarded()
            user = pd is None or not pd.leg  # (a leg is in no user's queue)
            stream = self.info.stream
            backlogs = self._config.backlogs
            backlog = None
            # in its role's prefill backlog: a stream until its first token (the reader's), a
            # prefill leg (not streamed, one token) until its answer
            if backlogs is not None and (stream or (pd is not None and pd.role is _PREFILL_LEG)):
                backlog = self._backlog = backlogs.whole if pd is None else backlogs.of[pd.role]
                backlog.enter(t_ns, self._size)
                self.waits = not stream
            if stream and (user or backlog is not None):
                self._reader.wait(user, backlog, self._size)
            if self._timeline is not None:
                self._timeline.started(id(self), self._clock)
        except Exception:
            self._fail("forwarded")

    def _left_backlog(self, backlog: PrefillBacklog, t_ns: int, stats: RequestStats) -> None:
        """The request ended: a prefill leg not streamed, still in the backlog, is served if
        answered, else abandons its place (a stream's first token is the reader's); the
        prompt tokens its engine counted teach the backlog its tokens per byte."""
        if self.waits:
            self.waits = False
            leg = self.pd is not None and self.pd.role is _PREFILL_LEG
            if leg and stats.outcome is _OK and 200 <= self.status < 300:
                backlog.depart(t_ns, self._size)
            else:
                backlog.abandon(t_ns, self._size)
        if stats.input_tokens and self._size:
            backlog.learn(self._size, stats.input_tokens)

    def held(self, t_ns: int) -> None:
        """The relay stopped reading the engine: this request's client takes nothing."""
        self._guard("held", self._clock.held, t_ns)

    def released(self, t_ns: int) -> None:
        """The relay reads the engine again."""
        self._guard("released", self._clock.released, t_ns)

    def response(self, status: int, content_type: str, encoding: str = "") -> None:
        """Response headers arrived: choose how to read the body (``encoding``: gRPC's)."""
        self.status = status
        try:
            self._reader.response(content_type, encoding)
            pd = self.pd  # its series appear now, before it ends (a leg's never)
            if 200 <= status < 400 and (pd is None or not pd.leg):
                provider = self._config.provider
                if provider is not None and not provider.settled and status < 300:
                    provider.dialect(self.route.name)  # (its series then bound under it)
                labels = self._labels = self._recorder.admission.labels(
                    self.info.model, self._tenant, True
                )
                self._sink.answered(self.operation, *labels)
        except Exception:
            self._fail("response")

    def trailers(self, fields: list[tuple[str, str]]) -> None:
        """The response's trailers (or a gRPC "trailers-only" head): a gRPC call's status,
        which then stands for its HTTP status (``grpc.http_status``), so that its outcome,
        status class and verdict follow the rules every request's do."""
        try:
            code = status_of(fields)
            dialect = self._reader.dialect
            if code is None:
                return
            if isinstance(dialect, GrpcDialect):
                dialect.on_status(code)
            self.grpc_status = code
            if code != STATUS_OK and self.status < 400:
                self.status = http_status(code)
        except Exception:
            self._fail("trailers")

    def _learn(self, dialect: Dialect) -> None:
        """An engine's ``GetModelInfo`` answer (OK) names the model its Generate requests
        are then counted under (``ServedModel``)."""
        served = self._config.served
        if (
            served is not None
            and isinstance(dialect, ModelInfoReply)
            and dialect.response_model
            and dialect.grpc_status in (None, STATUS_OK)
            and 200 <= self.status < 300
        ):
            served.name = dialect.response_model

    def _window_full(self, window: TokenWindow) -> None:
        """A window of a long stream filled: its ITLs go to the sink now (a leg's nowhere:
        its user's request's stream is the one users feel)."""
        if self.pd is not None and self.pd.leg:
            return
        # a long stream of a 2xx/3xx response: its model gets its label now, as its request
        # will at the end, so that its first window is not counted under "other"
        labels = self._labels
        if labels is None:
            admit = 200 <= self.status < 400
            labels = self._recorder.admission.labels(self.info.model, self._tenant, admit)
        self._sink.record_tokens(self.operation, labels[0], window, labels[1])
        if window.stalls and (self._stalls is None or len(self._stalls) < MAX_STALLS):
            stalls = self._judge_stalls((window,))
            if self._stalls is None:
                self._stalls = stalls
            else:
                self._stalls += stalls

    def _all_stalls(self, windows: Sequence[TokenWindow]) -> tuple[Stall, ...]:
        """The request's stalls: those of windows taken mid-stream, and of its last."""
        found = self._stalls or []
        if len(found) < MAX_STALLS:
            found = found + self._judge_stalls(windows)
        return tuple(found[:MAX_STALLS])

    def _leave_timeline(self, t_ns: int) -> None:
        """The request ended: the latest of its chunk times stay on the engine's timeline a
        while, for other requests' stalls."""
        clock, timeline = self._clock, self._timeline
        if timeline is not None and clock.forwarded_ns is not None:
            timeline.ended(id(self), t_ns, clock.trail(TRAIL_TIMES))

    def _judge_stalls(self, windows: Sequence[TokenWindow]) -> list[Stall]:
        """Each stall of ``windows``, with its cause (``causes``): work only where a window
        has a stall."""
        timeline = self._timeline
        if timeline is None:
            timeline = EngineTimeline()
        found: list[Stall] = []
        holds = self._clock.holds
        for window in windows:
            if window.stalls:
                gaps = stall_gaps(window)
                causes = timeline.classify(id(self), gaps, window.median_gap, holds)
                found += map(Stall._make, ((*g, c) for g, c in zip(gaps, causes, strict=True)))
        return found

    def finish(self, t_ns: int, outcome: Outcome) -> RequestStats | None:
        """Close the request with ``outcome``; only the first call has any effect.

        The request's record (with its last ITL windows and its verdict, judged once) goes
        to the sink first, then to each consumer (``Recorder.record``), each call guarded on
        its own: whatever else fails, the request is counted once, with its outcome.
        """
        if self._finished:
            return None
        self._finished = True
        if self._reader.queued:
            self._guard("finish", self._reader.leave, t_ns, False)
        if self._timeline is not None:  # before the clock cuts its tape in ``_close``
            self._guard("finish", self._leave_timeline, t_ns)
        failed = self._failed_finish
        try:
            stats, windows, malformed = self._close(t_ns, outcome)
        except Exception:
            failed()
            stats, windows, malformed = self._counted(t_ns, outcome), [], 0
        finished = self._record(stats, windows, failed, t_ns)  # made and delivered
        if self.pd is not None:  # whatever failed: its request waits for its legs no longer
            self._guard("finish", self.pd.release)
        sink = self._sink
        if malformed:
            self._guard("finish", sink.malformed, malformed)
        try:
            if self._live:
                sink.request_ended()
        except Exception:
            failed()
        if self._trace is not None:
            self._guard("finish", self._finish_trace, self._trace, finished, t_ns)
        self._clock.on_window = _nothing  # the clock's only reference to this observer
        return stats

    def _failed_finish(self) -> None:
        self._fail("finish")

    def _counted(self, t_ns: int, outcome: Outcome) -> RequestStats:
        """The statistics of a request whose observation broke: counted all the same, with
        its outcome."""
        return self._clock.counted(
            t_ns, operation=self.operation, model=self.info.model, outcome=outcome,
            status=self.status, stream=False, input_tokens=None, output_tokens=None,
        )  # fmt: skip

    def _record(
        self, stats: RequestStats, windows: list[TokenWindow], failed: Callable[[], None],
        t_ns: int,
    ) -> RequestRecord:  # fmt: skip
        """The request's record, made and delivered (``Recorder.record``) with what
        observation alone knows: its TTFT in phases, its stalls' causes, its trace, its role
        in P/D; and its place in the prefill backlog, given up. What fails here is counted,
        and the record goes on with what was made."""
        phases: TtftPhases | None = None
        stalls: tuple[Stall, ...] = ()
        trace_ref: TraceRef | None = None
        pd = self.pd
        role = _WHOLE if pd is None else pd.role  # (a leg stays one if what follows fails)
        try:  # the guards of _guard, inline: once per request
            if pd is not None:
                phases, role = self._pd_finished(pd, stats, t_ns)
            elif stats.ttft_s is not None:
                phases = self._clock.ttft_phases(stats)
            if stats.stalls:
                stalls = self._all_stalls(windows)
            if self._backlog is not None and (self.waits or stats.input_tokens):
                self._left_backlog(self._backlog, t_ns, stats)
            if self._trace is not None:
                trace_ref = self._trace_ref(self._trace)
        except Exception:
            failed()
        return self._recorder.record(
            stats, failed, windows, self._tenant, phases, stalls, trace_ref, self.info,
            self._labels, role,
        )  # fmt: skip

    def _pd_finished(
        self, pd: PdRequest, stats: RequestStats, t_ns: int
    ) -> tuple[TtftPhases | None, PdRole]:
        """A request with a part in P/D ended: its role, held against its answer, and its
        phases across the pods (``disagg``)."""
        queue, prefill = stats.engine_queue_s, stats.engine_prompt_eval_s
        pd.finished(stats.status, self._reader.dialect.kv_transfer, queue, prefill)
        if pd.role is _WHOLE:
            return (self._clock.ttft_phases(stats) if stats.ttft_s is not None else None), pd.role
        clock = self._clock
        forwarded, first, _, end = clock.phases(t_ns)
        return pd.phases((clock.start_ns, forwarded, first, end), queue, prefill), pd.role

    @staticmethod
    def _trace_ref(trace: TraceHandle) -> TraceRef | None:
        """The request's trace, for the exemplars of its observations (None: no ids)."""
        ids = trace.ids()
        return TraceRef(*ids, trace.keep) if ids is not None else None

    def _finish_trace(self, trace: TraceHandle, finished: RequestRecord, t_ns: int) -> None:
        captured = self._reader.dialect.captured
        completion = truncate("".join(captured)) if captured is not None else None
        trace.finish(finished, self._clock.phases(t_ns), completion)

    def _guard(self, where: str, fn: Callable[..., object], *args: object) -> None:
        try:
            fn(*args)
        except Exception:
            self._fail(where)

    def _close(self, t_ns: int, outcome: Outcome) -> tuple[RequestStats, list[TokenWindow], int]:
        """The final record, last windows and malformed count; no sink is called here."""
        stream, malformed = self._reader.close(outcome is Outcome.OK)
        dialect = self._reader.dialect
        if self.route.grpc:
            stream = stream and self.info.stream  # not streamed: one message, nothing to time
            self._learn(dialect)
        if outcome is Outcome.OK and (self.status >= 500 or (self.status < 400 and dialect.error)):
            outcome = Outcome.UPSTREAM_ERROR  # an engine error: 5xx, or an error in a 2xx stream
        elif outcome is Outcome.OK and self._reader.grpc and self.grpc_status is None:
            outcome = Outcome.UPSTREAM_ERROR  # a gRPC stream that ended with no status
        reasoning, reasoning_source = dialect.reasoning_tokens, TokenSource.USAGE
        if reasoning is None and dialect.reasoning_chunks:
            reasoning, reasoning_source = dialect.reasoning_chunks, TokenSource.COUNTED
        timers, windows = self._clock.close(
            None if dialect.per_chunk_usage else dialect.output_tokens
        )
        record = finish_request(
            timers,
            t_ns,
            operation=self.operation,
            model=self.info.model,
            outcome=outcome,
            status=self.status,
            stream=stream,
            input_tokens=dialect.input_tokens,
            output_tokens=dialect.output_tokens,
            response_model=dialect.response_model,
            response_id=dialect.response_id,
            finish_reasons=tuple(dialect.finish_reasons),
            finish_reason=_finish_label(
                outcome, dialect.finish_reason, self.status >= 400 or dialect.error
            ),
            reasoning_tokens=reasoning,
            reasoning_source=reasoning_source,
            cached_tokens=dialect.cached_tokens,
            engine_prompt_eval_s=dialect.engine_prompt_eval_s,
            engine_load_s=dialect.engine_load_s,
            dialect=self.route.name,
            engine_queue_s=dialect.engine_queue_s,
            grpc_status=self.grpc_status,
        )
        return record, windows, malformed


def _nothing(window: TokenWindow) -> None:
    """Where a finished request's clock hands windows (none fill: the request ended)."""


def _finish_label(outcome: Outcome, reason: str, failed: bool) -> str:
    """The finish-reason label: what the engine said, or what the outcome implies. One rule
    for every API: a request that ended in an error (a status of 400 or more, an error the
    engine reported in its body or stream, an engine failure or timeout) and that no finish
    reason describes is ``error``."""
    if outcome in (Outcome.CLIENT_DISCONNECT, Outcome.SHUTDOWN):
        return ABORTED
    failed = failed or outcome in (Outcome.UPSTREAM_ERROR, Outcome.UPSTREAM_TIMEOUT)
    if failed and reason == NONE:
        return ERROR
    return reason
