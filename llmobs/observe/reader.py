"""The stream reader: a response body's reads -> framing -> dialect -> the request clock.

Per read of a streaming response it finds the output tokens and tells the request clock when
they came. The usual read, one plain token event of a stream past its first token, is
recognised whole and only timed (the fast path, ``WholeEvent``); a read of several such events
is counted whole; the rest goes through the decoder and the dialect. A JSON body is kept
(bounded) and read once at the end. The reader also keeps the request's place in the prefill
queue (``wait``: from going upstream to its first output). Errors are not raised: they
stop the reading (``fail``: counted, logged once), since the relay must never see them.
"""

from __future__ import annotations

import contextlib
import logging

from llmobs.observe.clock import RequestClock
from llmobs.observe.dialects import detect_stream
from llmobs.observe.dialects.base import Dialect, loads
from llmobs.observe.dialects.openai import PLAIN, OpenAIStream, Template, WholeEvent
from llmobs.observe.framing import Framing, GrpcDecoder, NdjsonDecoder, SseDecoder
from llmobs.observe.record import LiveCounts
from llmobs.observe.saturation import PrefillBacklog

log = logging.getLogger("llmobs.observer")

MAX_JSON_BODY = 8 * 1024**2  # non-streaming responses larger than this are timed, not parsed


class StreamReader:
    """Reads one response body for the request clock."""

    # Slots are laid out in sorted order: the fast path's (``_fast*``) are named to sit side
    # by side, so that a read touches as little of this object as it can.
    __slots__ = (
        "_backlog",
        "_body",
        "_body_size",
        "_clock",
        "_counted",
        "_counts",
        "_decoder",
        "_fast_event",
        "_fast_limit",
        "_fast_times",
        "_last_ns",
        "_max_line",
        "_on_data",
        "_openai",
        "_output",
        "_size",
        "_sse",
        "_template_event",
        "_template_of",
        "dialect",
        "failed",
        "grpc",
        "queued",
    )

    def __init__(
        self,
        clock: RequestClock,
        dialect: Dialect,
        counts: LiveCounts,
        max_line_bytes: int,
    ) -> None:
        """``counts``: the sink's live counts (the queue, observation errors)."""
        self._clock = clock
        self._counts = counts
        self._fast_times = clock.tape  # the usual read appends its time here
        self._fast_limit = clock.limit
        self._output = clock.output  # called per read that is not the usual one
        self._max_line = max_line_bytes
        self._decoder: Framing | None = None
        self._sse: SseDecoder | None = None
        # the dialect's template as a whole event (``WholeEvent``: reads of such events are
        # counted whole), the template it was made from, and the same event while the next
        # read's only need is to be timed (the fast path checks it against that read)
        self._template_event: WholeEvent | None = None
        self._template_of: Template | None = None
        self._fast_event: WholeEvent | None = None
        self._body: list[bytes] | None = None
        self._body_size = 0
        self.queued = False  # in the prefill queue: went upstream, no output yet
        self._counted = False  # ... and counted in the sink's queue (a user's request)
        self._backlog: PrefillBacklog | None = None  # ... and in this prefill backlog
        self._size = 0  # ... with a prompt of so many bytes
        self.failed = False
        self.grpc = False  # the response is a gRPC stream (its status due in its trailers)
        # arrival of the latest read not taken by the fast path: what a flush at the end
        # finds, a read left there (the fast path takes reads only while nothing is pending)
        self._last_ns = 0
        self.dialect = dialect
        self._on_data = dialect.on_data  # bound once: called per event
        self._openai = dialect if isinstance(dialect, OpenAIStream) else None

    def use(self, dialect: Dialect) -> None:
        """Read the body with ``dialect`` (chosen again when the request body says so)."""
        self.dialect = dialect
        self._on_data = dialect.on_data  # bound once: called per event
        self._openai = dialect if isinstance(dialect, OpenAIStream) else None

    def wait(
        self, counted: bool = True, backlog: PrefillBacklog | None = None, size: int = 0
    ) -> None:
        """The request went upstream, streaming: it waits in the prefill queue until its
        first output. ``counted``: in the sink's queue (a user's request, not a leg's);
        ``backlog``: the prefill backlog it waits in, with a prompt of ``size`` bytes."""
        if not self.queued:
            self.queued = True
            self._fast_event = None  # reads leave the queue through ``_record``
            self._counted = counted
            self._backlog = backlog
            self._size = size
            if counted:
                self._counts.queue_enter()

    def leave(self, t_ns: int, served: bool = True) -> None:
        """The request leaves the prefill queue at ``t_ns``: its first output (``served``), or
        its end without one."""
        if self.queued:
            self.queued = False
            if self._counted:
                self._counts.queue_leave()
            backlog = self._backlog
            if backlog is not None:
                self._backlog = None
                if served:
                    backlog.depart(t_ns, self._size)
                else:
                    backlog.abandon(t_ns, self._size)

    def fail(self, where: str) -> None:
        """Count an internal error, log it once, read nothing more."""
        if not self.failed:
            self.failed = True
            self.stop()
            log.exception("observation failed in %s; the relay continues", where)
        with contextlib.suppress(Exception):  # a broken sink must not break the relay
            self._counts.observer_error()

    def stop(self) -> None:
        """Read nothing more (observation of this request broke)."""
        self._decoder = self._sse = None
        self._template_event = self._fast_event = self._openai = None
        self._body = None

    def response(self, content_type: str, encoding: str = "") -> None:
        """Response headers arrived: choose how to read the body (``encoding``: a gRPC
        stream's ``grpc-encoding``)."""
        # this body's decoder only
        self._sse = self._template_event = self._fast_event = self._template_of = None
        kind = detect_stream(content_type)
        if kind == "sse":
            self._decoder = self._sse = SseDecoder(self._max_line)
        elif kind == "ndjson":
            self._decoder = NdjsonDecoder(self._max_line)
        elif kind == "grpc":
            self.grpc = True
            self._decoder = GrpcDecoder(self._max_line, encoding or "identity")
        elif kind == "json":
            self._body = []

    def chunk(self, t_ns: int, data: bytes) -> None:
        """A read of the response body relayed at ``t_ns``. The hot path: no per-event
        objects or lookups that can be hoisted."""
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
                try:  # the clock's ``output(t_ns, 1)`` for choice 0, inlined (``tape``)
                    times = self._fast_times
                    times.append(t_ns)
                    if len(times) > self._fast_limit:
                        self._clock.full()
                except Exception:
                    self.fail("chunk")
                return
        self._last_ns = t_ns
        try:
            if self._template_event is None or not self._count_events(t_ns, data):
                self._decode(t_ns, data)
        except Exception:
            self.fail("chunk")

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
            self._keep(data)
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
            if self.queued or self.dialect.pending:
                self._record(t_ns, tokens)
            elif self._output(t_ns, tokens):
                self._clock.full()
        openai = self._openai
        if openai is not None and openai.template is not self._template_of:
            self._template_of = openai.template
            if self._sse is not None:
                self._template_event = WholeEvent.of(openai.template, self._sse, self._max_line)
        self._arm()

    def _keep(self, data: bytes) -> None:
        """A read of a body that is not a stream: kept (bounded) for the dialect at the end."""
        body = self._body
        if body is not None:
            self._body_size += len(data)
            if self._body_size <= MAX_JSON_BODY:
                body.append(data)
            else:
                self._body = None

    def _arm(self) -> None:
        """Take the fast path for the next read if a whole event would only be timed there:
        nothing left in the decoder, and past the first token (a template is made from a
        token, so always; ``wait`` disarms it, should it come after the response began).
        Only the other paths change either, so they re-arm it after each read. (Other choices'
        tokens are never pending here: ``_record`` takes them in the read that counts them.)"""
        whole = self._template_event
        self._fast_event = (
            whole if whole is not None and whole.decoder.idle and not self.queued else None
        )

    def _record(self, t_ns: int, tokens: int) -> None:
        """A read's output tokens to the clock: other choices' are the dialect's pending."""
        if self.queued:
            self.leave(t_ns)
        dialect = self.dialect
        if dialect.pending:
            self._clock.choices(t_ns, tokens, dialect.take_pending())
        elif self._output(t_ns, tokens):
            self._clock.full()

    def close(self, complete: bool) -> tuple[bool, int]:
        """The body ended (``complete``: normally): the decoder's last event, if the stream
        was not cut (a cut stream's partial last event is not evidence), or the kept JSON
        body, read now. Whether the body was a stream, and the events the decoder or the
        dialect could not read."""
        dialect = self.dialect
        decoder = self._decoder
        if decoder is not None:
            if complete:
                payloads = decoder.flush_payloads()
                if payloads:
                    tokens = sum(dialect.on_data(p) for p in payloads)
                    if tokens:
                        self._record(self._last_ns, tokens)
            return True, decoder.malformed + dialect.malformed
        if self._body:
            try:
                obj = loads(b"".join(self._body))
                if isinstance(obj, list) and len(obj) == 1:  # TGI's compat route (POST /)
                    obj = obj[0]  # wraps its one generation in a list, as api-inference did
                if isinstance(obj, dict):
                    dialect.on_body(obj)
            except ValueError:
                pass  # a non-JSON body labelled as JSON: relayed, just not read
        return False, 0
