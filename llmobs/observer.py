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
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmobs.formats import detect_stream
from llmobs.formats.framing import SseDecoder
from llmobs.formats.openai import OpenAIStream, loads
from llmobs.metrics import MetricsSink
from llmobs.stats import EMPTY_WINDOW, TokenWindow
from llmobs.timing import Outcome, StreamStats, StreamTimer

log = logging.getLogger("llmobs.observer")

MAX_JSON_BODY = 8 * 1024**2  # non-streaming responses larger than this are timed, not parsed


@dataclass(frozen=True, slots=True)
class ObserveConfig:
    """The observation knobs, taken from Settings once."""

    stall_factor: float = 3.0
    stall_min_gap: float = 0.05
    max_line_bytes: int = 1 << 20


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What the request body says that telemetry may use (no prompt text)."""

    model: str | None = None
    stream: bool = False


_PARSE_LIMIT = 1 << 20
_SCAN = 64 * 1024
_MODEL_RE = re.compile(rb'"model"\s*:\s*"((?:[^"\\]|\\.){1,256})"')
_STREAM_RE = re.compile(rb'"stream"\s*:\s*true\b')


def parse_request(body: bytes) -> RequestInfo:
    """Pick the model and stream flag out of a JSON request body; tolerate anything.

    Bodies up to 1 MiB are parsed (orjson when present: ~1 ms per MiB). Larger ones (long
    prompts, images) are only scanned at both ends, where clients put these keys, so that a
    16 MiB prompt does not hold up every other stream on the event loop.
    """
    if len(body) > _PARSE_LIMIT:
        ends = body[:_SCAN] + b"\n" + body[-_SCAN:]
        found = _MODEL_RE.search(ends)
        model = found.group(1).decode("utf-8", "replace") if found else None
        return RequestInfo(model, _STREAM_RE.search(ends) is not None)
    try:
        obj: Any = loads(body)
    except ValueError:
        return RequestInfo()
    if not isinstance(obj, dict):
        return RequestInfo()
    model = obj.get("model")
    return RequestInfo(model if isinstance(model, str) else None, obj.get("stream") is True)


class Observer:
    """Observation of one proxied request."""

    __slots__ = (
        "_body",
        "_body_size",
        "_decoder",
        "_dialect",
        "_failed",
        "_finished",
        "_last_ns",
        "_max_line",
        "_queued",
        "_sink",
        "_timer",
        "info",
        "operation",
        "status",
    )

    def __init__(
        self, sink: MetricsSink, config: ObserveConfig, operation: str, start_ns: int
    ) -> None:
        self._sink = sink
        self.operation = operation
        self.info = RequestInfo()
        self.status = 0
        self._timer = StreamTimer(
            start_ns, factor=config.stall_factor, min_gap=config.stall_min_gap
        )
        self._decoder: SseDecoder | None = None
        self._dialect = OpenAIStream()
        self._body: list[bytes] | None = None
        self._body_size = 0
        self._queued = False
        self._finished = False
        self._last_ns = start_ns  # arrival of the latest chunk
        self._failed = False
        self._max_line = config.max_line_bytes
        sink.request_started()

    def _fail(self, where: str) -> None:
        """Count an internal error, log it once, stop observing this request."""
        if not self._failed:
            self._failed = True
            self._decoder = None
            self._body = None
            log.exception("observation failed in %s; the relay continues", where)
        with contextlib.suppress(Exception):  # a broken sink must not break the relay
            self._sink.observer_error()

    def request_body(self, body: bytes) -> None:
        """The request body as forwarded (JSON bodies only); parsed for model and stream."""
        try:
            self.info = parse_request(body)
        except Exception:
            self._fail("request_body")

    def forwarded(self) -> None:
        """The request went upstream: a streaming request now waits for its first token."""
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
        try:
            kind = detect_stream(content_type)
            if kind == "sse":
                self._decoder = SseDecoder(self._max_line)
            elif kind == "json":
                self._body = []
        except Exception:
            self._fail("response")

    def chunk(self, t_ns: int, data: bytes) -> None:
        """A chunk of the response body was relayed at ``t_ns``. The hot path."""
        self._last_ns = t_ns
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
        try:
            tokens = 0
            on_data = self._dialect.on_data
            for event in decoder.feed(data):
                tokens += on_data(event.data)
            if tokens:
                timer = self._timer
                if timer.output(t_ns, tokens):
                    self._leave_queue()
                if timer.window_full:
                    self._sink.record_tokens(self.operation, self.info.model, timer.take_window())
        except Exception:
            self._fail("chunk")

    def finish(self, t_ns: int, outcome: Outcome) -> StreamStats | None:
        """Close the request with ``outcome``; only the first call has any effect.

        Each sink call is guarded on its own, and the request record goes first: whatever
        else fails, the request is counted once, with its outcome.
        """
        if self._finished:
            return None
        self._finished = True
        self._guard("finish", self._leave_queue)
        sink = self._sink
        record: StreamStats | None = None
        window = EMPTY_WINDOW
        malformed = 0
        try:
            record, window, malformed = self._close(t_ns, outcome)
        except Exception:
            self._fail("finish")
        if record is None:  # observation broke: still count the request and its outcome
            record = self._timer.finish(
                t_ns, operation=self.operation, model=self.info.model, outcome=outcome,
                status=self.status, stream=False, input_tokens=None, output_tokens=None,
            )  # fmt: skip
        self._guard("finish", sink.record_request, record)
        self._guard("finish", sink.record_tokens, self.operation, self.info.model, window)
        self._guard("finish", sink.malformed, malformed)
        self._guard("finish", sink.request_ended)
        return record

    def _guard(self, where: str, fn: Callable[..., object], *args: object) -> None:
        try:
            fn(*args)
        except Exception:
            self._fail(where)

    def _close(self, t_ns: int, outcome: Outcome) -> tuple[StreamStats, TokenWindow, int]:
        """The final record, last window and malformed count; no sink is called here."""
        dialect = self._dialect
        malformed = 0
        if self._decoder is not None:
            if outcome is Outcome.OK:  # a cut stream's partial last event is not evidence
                tokens = sum(dialect.on_data(e.data) for e in self._decoder.flush())
                if tokens:
                    self._timer.output(self._last_ns, tokens)
            malformed = self._decoder.malformed + dialect.malformed
        elif self._body:
            try:
                obj = loads(b"".join(self._body))
                if isinstance(obj, dict):
                    dialect.on_object(obj)
            except ValueError:
                pass  # a non-JSON body labelled as JSON: relayed, just not read
        if outcome is Outcome.OK and (self.status >= 500 or (self.status < 400 and dialect.error)):
            outcome = Outcome.UPSTREAM_ERROR  # an engine error: 5xx, or an error in a 2xx stream
        timer = self._timer
        total = None if dialect.per_chunk_usage else dialect.output_tokens
        window = timer.take_window(total_tokens=total)
        record = timer.finish(
            t_ns,
            operation=self.operation,
            model=self.info.model,
            outcome=outcome,
            status=self.status,
            stream=self._decoder is not None,
            input_tokens=dialect.input_tokens,
            output_tokens=dialect.output_tokens,
            response_model=dialect.response_model,
            response_id=dialect.response_id,
            finish_reasons=tuple(dialect.finish_reasons),
        )
        return record, window, malformed
