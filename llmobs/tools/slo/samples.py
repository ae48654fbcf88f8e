"""Samples, as both reports take them from either source: (family, labels, value).

A sidecar's /metrics text is parsed here (pure): only the families a report asks for are
kept, and the page says whether it is a sidecar's at all (its llmobs_ series), so that both
commands tell an engine's page from a sidecar's by the same check (``sources.read_page``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, Mapping[str, str], float]  # family (or sample) name, labels, value

# the labels both reports group by, as the sidecar exports them
OPERATION, MODEL, TENANT = "gen_ai_operation_name", "gen_ai_request_model", "tenant"
OURS = "llmobs_"  # every family a sidecar exports starts so; an engine's none


def page_samples(text: str, names: Collection[str]) -> tuple[list[Sample], bool]:
    """The samples named in ``names`` of a /metrics page, and whether the page has any llmobs
    series (a sidecar's does, an engine's does not); ``ValueError`` when it is not in the
    exposition format."""
    samples: list[Sample] = []
    ours = False
    for family in text_string_to_metric_families(text):
        ours = ours or family.name.startswith(OURS)
        samples.extend((s.name, s.labels, float(s.value)) for s in family.samples
                       if s.name in names)  # fmt: skip
    return samples, ours
