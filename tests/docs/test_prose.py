"""README.md and docs/*.md describe the project as it is: no issue numbers (the tracker's
history is git's), every relative link and ``#anchor`` resolves as GitHub resolves it, and
every repository path and test they name exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.markdown import anchors, code_spans, links, prose, without_code_spans

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
IDS = [str(doc.relative_to(ROOT)) for doc in DOCUMENTS]

# "issue 9", "issues 22 and 23", "#23"; not "owner/repo#918", a link to another project's
# issue, nor an HTML entity (&#8203;)
ISSUE = re.compile(r"\bissues? #?\d+|(?<![\w/&])#\d+\b", re.IGNORECASE)
# a path in the repository: from one of its top-level folders
TOP = ("llmobs", "tests", "deploy", "benchmarks", "docs", "dashboards", ".ci")
PATH = re.compile(rf"^(?:{'|'.join(re.escape(t) for t in TOP)})/\S*$")
BARE_PATH = re.compile(
    rf"(?<![\w./-])(?:{'|'.join(t for t in TOP if not t.startswith('.'))})/[\w./-]*[\w/]"
)
PLACEHOLDER = re.compile(r"[<{$]")


def issue_references(text: str) -> list[str]:
    return ISSUE.findall(text)


def test_issue_references_are_found() -> None:
    assert issue_references("objectives (issue 23); issues 8 and 9; see #12.") == [
        "issue 23",
        "issues 8",
        "#12",
    ]
    assert issue_references("client_python cannot ([prometheus/client_python#918](u))") == []
    assert issue_references("[x](#llmobsttfthigh) and &#8203; and `| # |`") == []


@pytest.mark.parametrize("doc", DOCUMENTS, ids=IDS)
def test_no_issue_numbers(doc: Path) -> None:
    """The documents say what the project does; which issue brought it is git's record."""
    text = doc.read_text()
    found = [
        f"{doc.name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
        for m in ISSUE.finditer(text)
    ]
    assert found == []


def test_anchors_follow_githubs_rules() -> None:
    markdown = (
        "# Method (`llmobs bench`, 2026)\n## Hostile parties: everyone else's stream\n"
        "```bash\n# a comment, not a heading\n```\n## Real engine (llama.cpp, Gemma 3 270M)\n"
        "## Notes\n## Notes\n"
    )
    assert anchors(markdown) == {
        "method-llmobs-bench-2026",
        "hostile-parties-everyone-elses-stream",
        "real-engine-llamacpp-gemma-3-270m",
        "notes",
        "notes-1",
    }


@pytest.mark.parametrize("doc", DOCUMENTS, ids=IDS)
def test_relative_links_and_anchors_resolve(doc: Path) -> None:
    broken = []
    for target in links(doc.read_text()):
        if re.match(r"^[a-z][a-z+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
            broken.append(f"{target}: no such heading in {linked.relative_to(ROOT)}")
    assert broken == []


def named_paths(markdown: str) -> list[str]:
    """Repository paths the prose names: in code spans (``tests/x.py::test_y`` included),
    and bare ones."""
    text = prose(markdown)
    words = [word.rstrip(".,;:)") for span in code_spans(text) for word in span.split()]
    spans = [word for word in words if PATH.match(word)]
    bare = [p.rstrip(".") for p in BARE_PATH.findall(without_code_spans(text))]
    return spans + bare


def defined_tests() -> set[str]:
    return {
        name
        for file in (ROOT / "tests").rglob("test_*.py")
        for name in re.findall(r"^\s*(?:async )?def (test_\w+)\(", file.read_text(), re.M)
    }


def missing(path: str) -> str | None:
    """Why ``path`` (maybe ``file::test``, maybe a glob or a placeholder) names nothing."""
    file, _, test = path.partition("::")
    if PLACEHOLDER.search(file):
        return None  # `formats/<dialect>.py`, `/proc/<pid>`: a pattern, not a path
    if "*" in file:
        return None if any(ROOT.glob(file)) else "matches nothing"
    if not (ROOT / file).exists():
        return "no such file or folder"
    if test and not re.search(
        rf"^\s*(?:async )?def {re.escape(test)}\(", (ROOT / file).read_text(), re.M
    ):
        return f"no test {test}"
    return None


def test_named_paths_are_found() -> None:
    markdown = (
        "See `tests/support/fake_nvml.py` and `llmobs/wire/http1.py`, tests/unit/ and "
        "`tests/e2e/test_proxy.py::test_nothing_like_this`.\n```\nllmobs/not_prose.py\n```\n"
    )
    found = {path: missing(path) for path in named_paths(markdown)}
    assert found == {
        "tests/support/fake_nvml.py": None,
        "llmobs/wire/http1.py": "no such file or folder",
        "tests/unit/": None,
        "tests/e2e/test_proxy.py::test_nothing_like_this": "no test test_nothing_like_this",
    }


@pytest.mark.parametrize("doc", DOCUMENTS, ids=IDS)
def test_named_paths_exist(doc: Path) -> None:
    """A path in the repository (`llmobs/...`, `tests/...`, `deploy/...`, ...) or a test
    (`tests/....py::test_name`) that a document names exists."""
    text = doc.read_text()
    problems = {path: why for path in named_paths(text) if (why := missing(path))}
    assert problems == {}
    # a test named alone (after `tests/....py::test_a`, as `test_b`) is one of the suite's
    named = {word for span in code_spans(prose(text)) for word in re.findall(r"^test_\w+$", span)}
    assert named - defined_tests() == set()
