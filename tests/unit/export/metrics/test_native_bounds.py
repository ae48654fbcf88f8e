"""client_golang's table of native bucket bounds, as copied (``export.metrics.native_bounds``):
``2^schema`` bounds per schema, ascending from 0.5, each ``2^(j/2^schema) / 2`` to within a
few units in the last place (client_golang's own rounding, which decides where a value on a
bound falls), and each schema's bounds every other one of the next finer schema's, as a
coarser schema's buckets merge pairs of the finer's."""

from __future__ import annotations

import math

from llmobs.export.metrics.native_bounds import BOUNDS


def test_bounds_are_two_to_the_fraction_of_an_octave() -> None:
    assert len(BOUNDS) == 9  # schemas 0 to 8
    for schema, table in enumerate(BOUNDS):
        assert len(table) == 1 << schema
        assert table[0] == 0.5
        assert list(table) == sorted(set(table))
        assert all(0.5 <= bound < 1.0 for bound in table)
        for j, bound in enumerate(table):
            exact = 2.0 ** (j / (1 << schema)) / 2
            assert math.isclose(bound, exact, rel_tol=1e-15), (schema, j)
            assert abs(bound - exact) <= 4 * math.ulp(bound), (schema, j)


def test_a_coarser_schema_s_bounds_are_every_other_finer_bound() -> None:
    for schema in range(1, len(BOUNDS)):
        assert BOUNDS[schema][::2] == BOUNDS[schema - 1], schema
