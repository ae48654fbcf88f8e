"""Per request: decoder -> dialect -> timer -> sinks; never raises; ``finish()`` exactly once.

The proxy calls into an ``Observer`` at each stage of a request, always after the bytes have
gone to the client. Any exception inside observation is swallowed, counted
(``llmobs.observer.errors``) and logged once per request, and observation of that request stops:
the relay itself never sees it. ``finish()`` is idempotent, so whichever way a request ends
(normally, client gone, upstream broken, cancelled) exactly one outcome is recorded.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, field

from llmobs.config.objectives import Objectives, ObjectiveSet
from llmobs.observe.dialects import UNKNOWN, Route, detect_stream
from llmobs.observe.dialects.base import ABORTED, ERROR, NONE, loads
from llmobs.observe.dialects.openai import PLAIN, OpenAIStream, Template, WholeEvent
from llmobs.observe.dialects.request import NO_BODY, parse_request, truncate
from llmobs.observe.framing import Framing, NdjsonDecoder, SseDecoder
from llmobs.observe.record import (
    RequestConsumer,
    RequestDetails,
    RequestRecord,
    RequestSink,
    TraceHandle,
    TraceRef,
)
from llmobs.observe.slo import Verdict, judge
from llmobs.observe.stats import TokenWindow
from llmobs.observe.timing import Outcome, StreamStats, StreamTimer, TokenSource, finish_request

log = logging.getLogger("llmobs.observer")

MAX_JSON_BODY = 8 * 1024**2  # non-streaming responses larger than this are timed, not parsed
MAX_CHOICES = 16  # n > 1: choices timed separately, beyond this pooled into the last


@dataclass(frozen=True, slots=True)
class ObserveSettings:
    """The observation knobs, taken from the sidecar's Settings once."""

    stall_factor: float = 3.0
    stall_min_gap: float = 0.05
    max_line_bytes: int = 1 << 20
    capture_content: bool = False
    # what each request is judged by (the sink's: the app passes the same object)
    objectives: Objectives = field(default_factory=lambda: Objectives(ObjectiveSet()))


class Observer:
    """Observation of one proxied request."""

    # Slots are laid out in sorted order: the fast path's three (``_fast*``) are named to sit
    # side by side, so that a read touches as little of this object as it can.
    __slots__ = (
        "_body",
        "_body_size",
        "_choices",
        "_config",
        "_consumers",
        "_decoder",
        "_dialect",
        "_failed",
        "_fast_event",
        "_fast_times",
        "_fast_window",
        "_finished",
        "_forwarded_ns",
        "_last_ns",
        "_on_data",
        "_openai",
        "_output",
        "_pending",
        "_queued",
        "_sink",
        "_sse",
        "_template_event",
        "_template_of",
        "_timer",
        "_trace",
        "info",
        "operation",
        "route",
        "status",
    )

    def __init__(
        self,
        sink: RequestSink,
        config: ObserveSettings,
        route: Route,
        start_ns: int,
        trace: TraceHandle | None = None,
        consumers: Sequence[RequestConsumer] = (),
    ) -> None:
        """``sink`` counts the request live and is the record's first consumer; ``consumers``
        take the record after it, in order."""
        self._sink = sink
        self._consumers = consumers
        self._trace = trace
        self._forwarded_ns: int | None = None
        self._config = config
        self.status = 0
        self._timer = StreamTimer(
            start_ns, factor=config.stall_factor, min_gap=config.stall_min_gap
        )
        self._choices: dict[int, StreamTimer] | None = None  # choices other than 0 (n > 1)
        self._decoder: Framing | None = None
        self._use(route)
        self._output = self._timer.output  # bound once: called per output chunk
        self._fast_times = self._timer.times  # choice 0's times: one-token chunks append here
        self._fast_window = self._timer.window
        self._sse: SseDecoder | None = None
        # the dialect's template as a whole event (``WholeEvent``: reads of such events are
        # counted whole), the template it was made from, and the same event while the next
        # read's only need is to be timed (the fast path checks it against that read)
        self._template_event: WholeEvent | None = None
        self._template_of: Template | None = None
        self._fast_event: WholeEvent | None = None
        self._body: list[bytes] | None = None
        self._body_size = 0
        self._queued = False
        self._finished = False
        self._failed = False
        # arrival of the latest read not taken by the fast path: what a flush at the end
        # finds, a read left there (the fast path takes reads only while nothing is pending)
        self._last_ns = start_ns
        sink.request_started()

    def _use(self, route: Route) -> None:
        """Measure the request as ``route``: its operation and a dialect of its own."""
        self.route = route
        self.operation = route.operation
        self.info = NO_BODY[route.always_streams]
        dialect = self._dialect = route.dialect()
        if self._config.capture_content:
            dialect.captured = []
        self._on_data = dialect.on_data  # bound once: called per event
        self._openai = dialect if isinstance(dialect, OpenAIStream) else None
        self._pending = dialect.pending

    def _fail(self, where: str) -> None:
        """Count an internal error, log it once, stop observing this request."""
        if not self._failed:
            self._failed = True
            self._decoder = None
            self._template_event = self._fast_event = self._openai = None
            self._body = None
            log.exception("observation failed in %s; the relay continues", where)
        with contextlib.suppress(Exception):  # a broken sink must not break the relay
            self._sink.observer_error()

    def request_body(self, body: bytes) -> None:
        """The request body as forwarded (JSON bodies only); parsed for model and stream."""
        try:
            confirm = self.route.confirm
            if confirm is not None and confirm not in body:  # not the route's API after all
                self._use(UNKNOWN)
            self.info = parse_request(body, self.route, self._config.capture_content)
        except Exception:
            self._fail("request_body")

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Add this request's trace context to the upstream request, when tracing."""
        if self._trace is not None:
            self._guard("inject", self._trace.inject, headers)

    def forwarded(self, t_ns: int) -> None:
        """The request went upstream: a streaming request now waits for its first token."""
        self._forwarded_ns = t_ns
        self._fast_event = None  # (the proxy forwards before any response) reads leave the queue
        try:
            if self.info.stream and not self._queued:
                self._queued = True
                self._sink.queue_enter()
        except Exception:
            self._fail("forwarded")

    def _leave_queue(self) -> None:
        if self._queued:
            self._queued = False
            self._sink.queue_leave()

    def response(self, status: int, content_type: str) -> None:
        """Response headers arrived: choose how to read the body."""
        self.status = status
        # this body's decoder only
        self._sse = self._template_event = self._fast_event = self._template_of = None
        try:
            kind = detect_stream(content_type)
            if kind == "sse":
                self._decoder = self._sse = SseDecoder(self._config.max_line_bytes)
            elif kind == "ndjson":
                self._decoder = NdjsonDecoder(self._config.max_line_bytes)
            elif kind == "json":
                self._body = []
        except Exception:
            self._fail("response")

    def chunk(self, t_ns: int, data: bytes) -> None:
        """A chunk of the response body was relayed at ``t_ns``. The hot path: a few
        microseconds per read, so no per-event objects or lookups that can be hoisted. The
        usual read, one plain token event of a stream past its first token, is recognised
        whole and only timed (``_fast_event``); a read of several is counted whole
        (``_count_events``); the rest goes through decoder and dialect (``_decode``)."""
        fast = self._fast_event
        if fast is not None:
            size = len(data)
            start = fast.start
            # slices and compares take fewer instructions than startswith and endswith,
            # which parse their arguments with a format string
            if (
                fast.size < size <= fast.limit
                and data[:start] == fast.head
                # the content is plain and the tail follows it: the tail's first byte, the
                # closing quote, is the first byte lstrip keeps
                and data[start:].lstrip(PLAIN) == fast.tail
            ):
                try:  # choice 0's timer.output(t_ns, 1), inlined
                    times = self._fast_times
                    times.append(t_ns)
                    if len(times) > self._fast_window:
                        self._take(self._timer)
                except Exception:
                    self._fail("chunk")
                return
        self._last_ns = t_ns
        try:
            if self._template_event is None or not self._count_events(t_ns, data):
                self._decode(t_ns, data)
        except Exception:
            self._fail("chunk")

    def _count_events(self, t_ns: int, data: bytes) -> bool:
        """A read of several whole token events shaped like the template: counted without
        the decoder (``WholeEvent.count``); False, with nothing done, for any other read."""
        events = self._template_event
        if events is None or len(data) <= 2 * events.size or not events.decoder.idle:
            return False
        tokens = events.count(data)
        if not tokens:
            return False
        self._record(t_ns, tokens)
        self._arm()
        return True

    def _decode(self, t_ns: int, data: bytes) -> None:
        """A read through the decoder and the dialect (or, for a JSON body, kept whole)."""
        decoder = self._decoder
        if decoder is None:
            body = self._body
            if body is not None:
                self._body_size += len(data)
                if self._body_size <= MAX_JSON_BODY:
                    body.append(data)
                else:
                    self._body = None
            return
        payloads = decoder.payloads(data)
        if len(payloads) == 1:
            tokens = self._on_data(payloads[0])
        else:
            on_data = self._on_data
            tokens = 0
            for payload in payloads:
                tokens += on_data(payload)
        if tokens:
            if self._queued or self._pending:
                self._record(t_ns, tokens)
            elif self._output(t_ns, tokens):  # choice 0's timer, bound: _record inlined
                self._take(self._timer)
        openai = self._openai
        if openai is not None and openai.template is not self._template_of:
            self._template_of = openai.template
            if self._sse is not None:
                self._template_event = WholeEvent.of(
                    openai.template, self._sse, self._config.max_line_bytes
                )
        self._arm()

    def _arm(self) -> None:
        """Take the fast path for the next read if a whole event would only be timed there:
        nothing left in the decoder, and past the first token (a template is made from a
        token, so always; ``forwarded`` disarms it, should it come after the response began).
        Only the other paths change either, so they re-arm it after each read. (Other choices'
        tokens are never pending here: ``_record`` drains them in the read that counts them.)"""
        whole = self._template_event
        self._fast_event = (
            whole if whole is not None and whole.decoder.idle and not self._queued else None
        )

    def _record(self, t_ns: int, tokens: int) -> None:
        """Attribute a read's output tokens to their choices' timers: choices other than 0
        are in the dialect's ``pending``, the rest is choice 0's."""
        if self._queued:
            self._leave_queue()
        pending = self._pending
        if pending:
            for choice, count in pending.items():
                tokens -= count
                timer = self._timer_for(choice)
                if timer.output(t_ns, count):
                    self._take(timer)
            pending.clear()
            if tokens <= 0:
                return
        if self._output(t_ns, tokens):
            self._take(self._timer)

    def _take(self, timer: StreamTimer) -> None:
        """A timer's window is full: its ITLs go to the sink now (long streams only)."""
        window = timer.take_window()
        self._fast_times = self._timer.times  # a new array after each window
        # a long stream of a 2xx/3xx response: its model gets its label now, as its request
        # will at the end, so that its first window is not counted under "other"
        admit = 200 <= self.status < 400
        self._sink.record_tokens(self.operation, self.info.model, window, admit)

    def _timer_for(self, choice: int) -> StreamTimer:
        if choice == 0:
            return self._timer
        if self._choices is None:
            self._choices = {}
        timer = self._choices.get(min(choice, MAX_CHOICES))
        if timer is None:
            config = self._config
            timer = self._choices[min(choice, MAX_CHOICES)] = StreamTimer(
                self._timer.start_ns, factor=config.stall_factor, min_gap=config.stall_min_gap
            )
        return timer

    def finish(self, t_ns: int, outcome: Outcome) -> StreamStats | None:
        """Close the request with ``outcome``; only the first call has any effect.

        The request's record (with its last ITL windows and its verdict, judged here once)
        goes to the sink first, then to each consumer, each call guarded on its own: whatever
        else fails, the request is counted once, with its outcome.
        """
        if self._finished:
            return None
        self._finished = True
        if self._queued:
            self._guard("finish", self._leave_queue)
        sink = self._sink
        record: StreamStats | None = None
        windows: list[TokenWindow] = []
        malformed = 0
        try:
            record, windows, malformed = self._close(t_ns, outcome)
        except Exception:
            self._fail("finish")
        if record is None:  # observation broke: still count the request and its outcome
            record = self._timer.finish(
                t_ns, operation=self.operation, model=self.info.model, outcome=outcome,
                status=self.status, stream=False, input_tokens=None, output_tokens=None,
            )  # fmt: skip
        verdict: Verdict | None = None
        trace_ref: TraceRef | None = None
        try:  # the guards of _guard, inline: once per request
            objectives = self._config.objectives.for_request(record.operation, record.model)
            verdict = judge(objectives, record)
            trace_ref = self._trace_ref()
        except Exception:
            self._fail("finish")
        finished = RequestRecord(record, tuple(windows), verdict, trace_ref)
        try:
            sink.consume(finished)
        except Exception:
            self._fail("finish")
        for consumer in self._consumers:
            self._guard("finish", consumer.consume, finished)
        if malformed:
            self._guard("finish", sink.malformed, malformed)
        try:
            sink.request_ended()
        except Exception:
            self._fail("finish")
        if self._trace is not None:
            trace = self._trace
            self._guard("finish", self._finish_trace, trace, record, windows, t_ns, verdict)
        return record

    def _trace_ref(self) -> TraceRef | None:
        """The request's trace, for the exemplars of its observations (None: not traced)."""
        trace = self._trace
        ids = trace.ids() if trace is not None else None
        return TraceRef(*ids, trace.keep) if ids is not None and trace is not None else None

    def _finish_trace(
        self,
        trace: TraceHandle,
        record: StreamStats,
        windows: list[TokenWindow],
        t_ns: int,
        verdict: Verdict | None,
    ) -> None:
        timers = [self._timer, *(self._choices or {}).values()]
        firsts = [t.first_ns for t in timers if t.first_ns is not None]
        lasts = [t.last_ns for t in timers if t.last_ns is not None]
        captured = self._dialect.captured
        details = RequestDetails(
            max_tokens=self.info.max_tokens,
            temperature=self.info.temperature,
            prompt=self.info.prompt,
            completion=truncate("".join(captured)) if captured is not None else None,
            verdict=verdict,
        )
        times = (self._forwarded_ns, min(firsts, default=None), max(lasts, default=None), t_ns)
        trace.finish(record, windows, times, details)

    def _guard(self, where: str, fn: Callable[..., object], *args: object) -> None:
        try:
            fn(*args)
        except Exception:
            self._fail(where)

    def _close(self, t_ns: int, outcome: Outcome) -> tuple[StreamStats, list[TokenWindow], int]:
        """The final record, last windows and malformed count; no sink is called here."""
        dialect = self._dialect
        malformed = 0
        decoder = self._decoder
        if decoder is not None:
            if outcome is Outcome.OK:  # a cut stream's partial last event is not evidence
                payloads = decoder.flush_payloads()
                if payloads:
                    tokens = sum(dialect.on_data(p) for p in payloads)
                    if tokens:
                        self._record(self._last_ns, tokens)
            malformed = decoder.malformed + dialect.malformed
        elif self._body:
            try:
                obj = loads(b"".join(self._body))
                if isinstance(obj, list) and len(obj) == 1:  # TGI's compat route (POST /)
                    obj = obj[0]  # wraps its one generation in a list, as api-inference did
                if isinstance(obj, dict):
                    dialect.on_body(obj)
            except ValueError:
                pass  # a non-JSON body labelled as JSON: relayed, just not read
        if outcome is Outcome.OK and (self.status >= 500 or (self.status < 400 and dialect.error)):
            outcome = Outcome.UPSTREAM_ERROR  # an engine error: 5xx, or an error in a 2xx stream
        choices = self._choices
        timers = [self._timer] if choices is None else [self._timer, *choices.values()]
        total = None if dialect.per_chunk_usage or len(timers) > 1 else dialect.output_tokens
        windows = [t.take_window(total) for t in timers]
        self._fast_times = self._timer.times
        reasoning, reasoning_source = dialect.reasoning_tokens, TokenSource.USAGE
        if reasoning is None and dialect.reasoning_chunks:
            reasoning, reasoning_source = dialect.reasoning_chunks, TokenSource.COUNTED
        record = finish_request(
            timers,
            t_ns,
            operation=self.operation,
            model=self.info.model,
            outcome=outcome,
            status=self.status,
            stream=decoder is not None,
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
        )
        return record, windows, malformed


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
