"""A fake of the metrics sink's live counts (``observe.record.LiveCounts``), for the code that
tells the sink about a running request without the sink's storage: the stream reader
(tests/unit/observe/test_reader.py)."""

from __future__ import annotations

from llmobs.observe.window import TokenWindow


class FakeCounts:
    """What a stream reader tells the sink, counted: the prefill queue and observation
    errors; the rest of ``LiveCounts``, which the reader never calls, does nothing here."""

    def __init__(self, broken: bool = False) -> None:
        self.queued = 0
        self.entered = 0
        self.errors = 0
        self.broken = broken  # the sink itself fails to count an error

    def queue_enter(self) -> None:
        self.queued += 1
        self.entered += 1

    def queue_leave(self) -> None:
        self.queued -= 1

    def observer_error(self) -> None:
        self.errors += 1
        if self.broken:
            raise RuntimeError("the sink is gone")

    def request_started(self) -> None: ...
    def answered(self, operation: str, label: str, tenant: str) -> None: ...
    def request_ended(self) -> None: ...
    def malformed(self, count: int) -> None: ...
    def record_tokens(
        self, operation: str, label: str, window: TokenWindow, tenant: str
    ) -> None: ...
