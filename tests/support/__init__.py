"""What the tests share: raw HTTP clients and upstreams, the servers the fixtures start, a
Prometheus harness, fakes (NVML), hypothesis strategies and the parsers' fuzz properties
(``fuzz``, which ``benchmarks/fuzz.py`` drives too). No test lives here."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
FIXTURES = ROOT / "tests" / "fixtures"
