"""Bounded label values: a client must not be able to grow the number of metric series.

Model names come from request bodies, i.e. from clients. The first ``limit`` distinct values
are kept as they are (truncated to a sane length); every later one is reported as ``other``.
A missing model is ``unknown``. Per-request detail belongs on spans, never on labels.

``OTHER`` and ``UNKNOWN`` are the two values every closed set of labels shares (a model or
tenant past the cap, an operation or finish reason of no known kind; a value not given, a
provider not yet found): defined here once, and imported wherever a set needs them.
"""

from __future__ import annotations

from llmobs.config.tenants import Tenancy

OTHER = "other"
UNKNOWN = "unknown"
MAX_LABEL_LENGTH = 128


class BoundedLabel:
    """Maps arbitrary strings onto at most ``limit`` values plus ``other`` and ``unknown``."""

    __slots__ = ("_known", "_reserved", "limit")

    def __init__(self, limit: int, reserved: frozenset[str] = frozenset()) -> None:
        """``reserved``: values the operator named (tenants of a key file), always their
        own label and not counted against ``limit``."""
        self.limit = limit
        self._known: set[str] = set()
        self._reserved = reserved

    def get(self, value: str | None, admit: bool = True) -> str:
        """The label for ``value``; a new value takes a free slot only when ``admit``.

        Callers admit values only from successful requests, so a client naming models the
        engine rejects (404s) cannot use up the slots of models deployed later.
        """
        if not value:
            return UNKNOWN
        value = value[:MAX_LABEL_LENGTH]
        if value in self._known or value in self._reserved:
            return value
        if admit and len(self._known) < self.limit and bounded(value) is not None:
            self._known.add(value)
            return value
        return OTHER

    def __len__(self) -> int:
        return len(self._known)


def bounded(value: str) -> str | None:
    """``value`` as a label may hold it: cut to ``MAX_LABEL_LENGTH``; None when it is not
    valid Unicode (a lone surrogate, a JSON escape the stdlib's parser accepts, would make
    every later rendering of /metrics fail to encode). For any label from outside."""
    value = value[:MAX_LABEL_LENGTH]
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value


class LabelAdmission:
    """A request's model and tenant onto the bounded sets every consumer labels by: admitted
    here once, in observation, so /metrics, OTLP and the MBU estimate agree, and apart from
    the series that store them (``export.metrics.sink``)."""

    __slots__ = ("models", "tenants")

    def __init__(
        self, max_models: int = 32, tenancy: Tenancy | None = None, max_tenants: int = 32
    ) -> None:
        """``tenancy``: the operator's tenants (None or off: tenants are not labelled, and a
        request's tenant label is "")."""
        self.models = BoundedLabel(max_models)
        on = tenancy is not None and tenancy.on
        self.tenants = BoundedLabel(max_tenants, tenancy.names) if tenancy and on else None

    def labels(self, model: str | None, tenant: str | None, admit: bool) -> tuple[str, str]:
        """A request's model and tenant labels (the tenant's "" when tenants are not
        labelled); new values take a slot only when ``admit`` (a successful request)."""
        tenants = self.tenants  # (an empty BoundedLabel is falsy: compare with None)
        label = tenants.get(tenant, admit) if tenants is not None else ""
        return self.models.get(model, admit), label
