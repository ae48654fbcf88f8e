"""Bounded label values (``llmobs.observe.labels``): the first ``limit`` distinct values keep
their names, every later one is ``other``, a missing one ``unknown``; a value is cut to 128
characters, and one that cannot be encoded never becomes a label. The sink's use of them (the
model label of every series): tests/unit/export/metrics/test_sink.py."""

from __future__ import annotations

import pytest

from llmobs.config.tenants import Tenancy
from llmobs.observe.labels import OTHER, UNKNOWN, BoundedLabel, LabelAdmission


def test_the_first_values_keep_their_names_and_later_ones_are_other() -> None:
    models = BoundedLabel(2)
    assert models.limit == 2
    seen = [models.get(v) for v in ("a", "b", "c", "a", "b", "d")]
    assert seen == ["a", "b", OTHER, "a", "b", OTHER]
    assert len(models) == 2


def test_a_limit_of_zero_keeps_no_name() -> None:
    models = BoundedLabel(0)
    assert models.get("a") == OTHER
    assert len(models) == 0


@pytest.mark.parametrize("value", [None, ""])
def test_a_missing_value_is_unknown_and_takes_no_slot(value: str | None) -> None:
    models = BoundedLabel(1)
    assert models.get(value) == UNKNOWN
    assert len(models) == 0
    assert models.get("a") == "a"


def test_a_value_not_admitted_takes_no_slot() -> None:
    """Only successful requests admit their model: a client naming models the engine rejects
    leaves the slots to models deployed later."""
    models = BoundedLabel(1)
    assert models.get("probe", admit=False) == OTHER
    assert len(models) == 0
    assert models.get("real") == "real"
    assert models.get("real", admit=False) == "real"  # a known value, admitted or not
    assert models.get("probe") == OTHER  # the one slot is taken now


def test_a_long_value_is_cut_to_its_first_128_characters() -> None:
    models = BoundedLabel(2)
    assert models.get("x" * 128) == "x" * 128
    cut = models.get("m" * 200)
    assert cut == "m" * 128
    assert models.get("m" * 129) == cut  # the same label: no slot of its own
    assert len(models) == 2


def test_a_value_that_is_not_unicode_is_other_and_takes_no_slot() -> None:
    """A lone surrogate (``"\\ud800"`` in JSON, which the stdlib's parser accepts) would make
    every later rendering of /metrics fail to encode if it became a label."""
    models = BoundedLabel(3)
    assert models.get("m\ud800") == OTHER
    assert models.get("\udfff") == OTHER
    assert len(models) == 0
    assert models.get("modèle-日本") == "modèle-日本"  # not ASCII, but valid Unicode
    assert len(models) == 1


def test_the_operators_own_names_always_keep_theirs() -> None:
    """Tenants a key file names: their own label whatever the slots, admitted or not, and
    none of the slots taken."""
    labels = BoundedLabel(1, frozenset({"team-a", "team-b"}))
    assert labels.get("team-a", admit=False) == "team-a"
    assert labels.get("x") == "x"
    assert labels.get("y") == "other"
    assert labels.get("team-b") == "team-b" and len(labels) == 1


def test_admission_labels_a_model_and_a_tenant_in_their_own_bounded_sets() -> None:
    """One admission for every consumer: models and tenants each capped on their own; the
    key file's tenants always their own name, never counted against the cap."""
    tenancy = Tenancy(header="x-tenant", keys={"sha256:" + "0" * 64: "named"})
    admission = LabelAdmission(1, tenancy, 1)
    assert admission.labels("m", "a", True) == ("m", "a")
    assert admission.labels("n", "b", True) == (OTHER, OTHER)
    assert admission.labels("m", "named", True) == ("m", "named")
    assert admission.labels(None, None, True) == (UNKNOWN, UNKNOWN)
    assert (len(admission.models), admission.tenants is not None) == (1, True)
    assert len(admission.tenants) == 1  # type: ignore[arg-type]


def test_admission_admits_only_when_told() -> None:
    admission = LabelAdmission(2, Tenancy(header="x-tenant"), 2)
    assert admission.labels("m", "a", False) == (OTHER, OTHER)
    assert admission.labels("m", "a", True) == ("m", "a")
    assert admission.labels("m", "a", False) == ("m", "a")  # known now


@pytest.mark.parametrize("tenancy", [None, Tenancy(), Tenancy(metrics=("requests",))])
def test_without_tenants_a_requests_tenant_label_is_empty(tenancy: Tenancy | None) -> None:
    admission = LabelAdmission(2, tenancy)
    assert admission.tenants is None
    assert admission.labels("m", "a", True) == ("m", "")
    assert LabelAdmission().models.limit == 32  # the default caps
    tenants = LabelAdmission(tenancy=Tenancy(header="x-tenant")).tenants
    assert tenants is not None and tenants.limit == 32
