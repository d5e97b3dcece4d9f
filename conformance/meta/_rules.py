"""Read the rules of the spec and the tests that cite them.

Shared by the meta tests (``test_rules.py``), the report (``rules_report.py``) and the docs
extension (``docs/_ext/mujou_rules.py``), so that all three see the same rules and citations.

The spec is read as text with one regex (:data:`RULE_LINE`), and the tests with :mod:`ast`,
never by collecting them: the result does not depend on pytest, on xdist or on whether the
tests can be imported. Nothing here imports :mod:`mujou` or :mod:`torch`.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPEC_DIR = REPO / "spec"
CONFORMANCE_DIR = REPO / "conformance"
META_DIR = Path(__file__).resolve().parent
LANGUAGES = ("en", "ja")

#: The first line of a rule directive. The only regex that reads rules.
RULE_LINE = re.compile(r"^:::\{rule\}\s+([a-z0-9.-]+)\s*$")
#: A line that opens a rule directive in any form MyST accepts (indented, with more colons, or
#: with backticks): one that RULE_LINE does not match is malformed.
RULE_ATTEMPT = re.compile(r"^\s*(?::{3,}|`{3,})\s*\{rule\}")
#: A well-formed ID: dot-separated lowercase components, hyphens inside a component,
#: at least two components (``page.specific``).
RULE_ID = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?:\.[a-z0-9]+(?:-[a-z0-9]+)*)+$")
#: The line that closes a rule directive.
RULE_END = ":::"
# Rules that may stay untested: a rule whose ID starts with one of these prefixes. Empty: every
# rule needs a test (the CUDA rules are cited by conformance/test_cuda.py, whose GPU tests skip
# where CUDA is missing). Keep the mechanism for a future page whose tests land after its text,
# and empty it again when they do.
UNTESTED_ALLOWED_PREFIXES: tuple[str, ...] = ()

#: The toctree of a page index lists the pages in reading order.
_TOCTREE_START = re.compile(r"^(`{3,}|:{3,})\{toctree\}")


@dataclass(frozen=True)
class Rule:
    """One rule directive of one language."""

    id: str
    lang: str
    page: str  # the file name without ".md", e.g. "threads-and-devices"
    path: Path
    line: int  # 1-based line of the opening ":::{rule}"
    text: str  # the normative text: the body, lines stripped of trailing space

    @property
    def sha256(self) -> str:
        """The checksum of the rule text, which changes when the words do (not the wrapping)."""
        return hashlib.sha256(" ".join(self.text.split()).encode("utf-8")).hexdigest()

    @property
    def location(self) -> str:
        return f"{_relative(self.path)}:{self.line}"


@dataclass(frozen=True)
class SpecProblem:
    """A line of the spec that is not a well-formed rule directive."""

    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{_relative(self.path)}:{self.line}: {self.message}"


@dataclass(frozen=True)
class Citation:
    """One rule ID in a ``pytest.mark.rule(...)`` of a test source."""

    rule_id: str
    path: Path
    line: int
    tests: tuple[str, ...]  # the node IDs of the tests it applies to (none: it marks no test)

    @property
    def location(self) -> str:
        return f"{_relative(self.path)}:{self.line}"


@dataclass(frozen=True)
class Citations:
    """What the test sources cite, and what could not be read in them."""

    citations: tuple[Citation, ...]
    problems: tuple[str, ...]

    def tests_by_rule(self) -> dict[str, list[str]]:
        """The node IDs of the tests citing each rule, each list sorted, without repeats."""
        found: dict[str, set[str]] = {}
        for citation in self.citations:
            found.setdefault(citation.rule_id, set()).update(citation.tests)
        return {rule_id: sorted(tests) for rule_id, tests in found.items() if tests}


def _relative(path: Path) -> str:
    try:
        return path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------------------------
# The spec


def parse_spec_page(path: Path, lang: str) -> tuple[list[Rule], list[SpecProblem]]:
    """The rules of one page, in order, and its malformed rule lines."""
    rules: list[Rule] = []
    problems: list[SpecProblem] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        match = RULE_LINE.match(line)
        if match is None:
            if RULE_ATTEMPT.match(line):
                problems.append(
                    SpecProblem(
                        path,
                        index + 1,
                        f"a rule must open with a line matching {RULE_LINE.pattern!r} "
                        f"(no indentation, three colons), got {line!r}",
                    )
                )
            index += 1
            continue
        rule_id = match.group(1)
        start = index
        body: list[str] = []
        index += 1
        while index < len(lines) and lines[index].rstrip() != RULE_END:
            if RULE_LINE.match(lines[index]):
                break
            body.append(lines[index].rstrip())
            index += 1
        if index >= len(lines) or lines[index].rstrip() != RULE_END:
            problems.append(SpecProblem(path, start + 1, f"rule {rule_id!r} is not closed by a ':::' line"))
        else:
            index += 1  # the closing ":::"
        if not RULE_ID.match(rule_id):
            problems.append(
                SpecProblem(
                    path,
                    start + 1,
                    f"rule ID {rule_id!r} is not well formed: lowercase components joined by "
                    "'.', hyphens inside a component, e.g. 'threads.hooks-exclusive'",
                )
            )
        text = "\n".join(body).strip("\n")
        if not text.strip():
            problems.append(SpecProblem(path, start + 1, f"rule {rule_id!r} has no text"))
        rules.append(Rule(rule_id, lang, path.stem, path, start + 1, text))
    return rules, problems


def toctrees(lang: str) -> list[list[str]]:
    """The entries of each toctree of the index of ``spec/<lang>``, in order.

    The first is the user's guide (non-normative pages), then the specification, then the
    reference.
    """
    index_path = SPEC_DIR / lang / "index.md"
    if not index_path.exists():
        return []
    found: list[list[str]] = []
    fence: str | None = None
    for line in index_path.read_text(encoding="utf-8").splitlines():
        if fence is None:
            match = _TOCTREE_START.match(line)
            if match:
                fence = match.group(1)
                found.append([])
            continue
        if line.strip() == fence:
            fence = None
            continue
        entry = line.strip()
        if entry and not entry.startswith(":"):
            found[-1].append(entry.removesuffix(".md"))
    return found


def guide_pages(lang: str) -> list[str]:
    """The pages of the user's guide: the first toctree of the index."""
    return next(iter(toctrees(lang)), [])


def page_order(lang: str) -> list[str]:
    """The pages of one language: those of the index's toctrees in order, then the rest."""
    pages = sorted(path.stem for path in (SPEC_DIR / lang).glob("*.md"))
    listed = [entry for toctree in toctrees(lang) for entry in toctree]
    # The index first, then the toctrees' order, then pages no toctree lists.
    return [page for page in dict.fromkeys(["index", *listed, *pages]) if page in pages]


@dataclass(frozen=True)
class Spec:
    """The rules of one language, page by page in reading order."""

    lang: str
    pages: dict[str, list[Rule]]
    problems: tuple[SpecProblem, ...]

    def rules(self) -> Iterator[Rule]:
        for rules in self.pages.values():
            yield from rules

    def ids(self) -> list[str]:
        return [rule.id for rule in self.rules()]


def load_spec(lang: str) -> Spec:
    """Read every page of ``spec/<lang>``."""
    pages: dict[str, list[Rule]] = {}
    problems: list[SpecProblem] = []
    for page in page_order(lang):
        rules, page_problems = parse_spec_page(SPEC_DIR / lang / f"{page}.md", lang)
        pages[page] = rules
        problems.extend(page_problems)
    return Spec(lang, pages, tuple(problems))


# --------------------------------------------------------------------------------------------
# The tests


def _is_rule_mark(node: ast.expr) -> bool:
    """Whether ``node`` is ``pytest.mark.rule`` or ``mark.rule``."""
    if not (isinstance(node, ast.Attribute) and node.attr == "rule"):
        return False
    owner = node.value
    if isinstance(owner, ast.Attribute):
        return owner.attr == "mark"
    return isinstance(owner, ast.Name) and owner.id == "mark"


def _rule_calls(expr: ast.AST) -> Iterator[ast.Call]:
    """Every ``pytest.mark.rule(...)`` call inside ``expr`` (in a list, in pytest.param(...))."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Call) and _is_rule_mark(node.func):
            yield node


def _call_ids(call: ast.Call, path: Path, problems: list[str]) -> list[tuple[str, int]]:
    ids: list[tuple[str, int]] = []
    where = f"{_relative(path)}:{call.lineno}"
    if call.keywords or not call.args:
        problems.append(f"{where}: pytest.mark.rule takes one or more rule IDs, nothing else")
    for arg in call.args:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            ids.append((arg.value, arg.lineno))
        else:
            problems.append(
                f"{where}: pytest.mark.rule takes rule IDs as string literals, got {ast.unparse(arg)!r}"
            )
    return ids


def _pytestmark(body: list[ast.stmt]) -> list[ast.expr]:
    """The values assigned to ``pytestmark`` in a module or class body."""
    values: list[ast.expr] = []
    for statement in body:
        if isinstance(statement, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in statement.targets):
                values.append(statement.value)
        elif (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and statement.target.id == "pytestmark"
            and statement.value is not None
        ):
            values.append(statement.value)
    return values


def parse_test_file(path: Path) -> tuple[list[Citation], list[str]]:
    """The rule citations of one test module, and what is wrong with them.

    A mark applies to the tests under it: module ``pytestmark`` to every test of the module,
    a class's decorators and ``pytestmark`` to the tests of the class, a function's
    decorators (``pytest.param(..., marks=...)`` inside them included) to that function.
    """
    problems: list[str] = []
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as exc:
        return [], [f"{_relative(path)}:{exc.lineno}: cannot parse: {exc.msg}"]

    module_id = _relative(path)
    # Every call found, by position, with the tests it applies to.
    applies: dict[tuple[int, int], list[str]] = {}
    calls: dict[tuple[int, int], ast.Call] = {}

    def note(exprs: Iterable[ast.expr]) -> list[tuple[int, int]]:
        keys: list[tuple[int, int]] = []
        for expr in exprs:
            for call in _rule_calls(expr):
                key = (call.lineno, call.col_offset)
                calls[key] = call
                applies.setdefault(key, [])
                keys.append(key)
        return keys

    def visit(body: list[ast.stmt], prefix: str, inherited: list[tuple[int, int]], collected: bool) -> None:
        """Walk a module or class body; ``collected``: whether pytest collects its tests."""
        marks_here = inherited + note(_pytestmark(body))
        for statement in body:
            if isinstance(statement, ast.ClassDef):
                own = note(statement.decorator_list)
                is_test_class = collected and statement.name.startswith("Test")
                if own and not is_test_class:
                    problems.append(
                        f"{module_id}:{statement.lineno}: class {statement.name!r} cites rules "
                        "but pytest does not collect it (its name must start with 'Test')"
                    )
                visit(statement.body, f"{prefix}{statement.name}::", marks_here + own, is_test_class)
            elif isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                own = note(statement.decorator_list)
                if collected and statement.name.startswith("test"):
                    for key in marks_here + own:
                        applies[key].append(f"{module_id}::{prefix}{statement.name}")
                elif own:
                    problems.append(
                        f"{module_id}:{statement.lineno}: {prefix}{statement.name} cites rules "
                        "but pytest does not collect it as a test (a function or method whose "
                        "name starts with 'test', in the module or in a class named 'Test...')"
                    )

    visit(tree.body, "", [], collected=True)
    # Marks outside the places above (e.g. in a helper's body) still count for "IDs exist".
    for call in _rule_calls(tree):
        key = (call.lineno, call.col_offset)
        if key not in calls:
            calls[key] = call
            applies[key] = []

    citations: list[Citation] = []
    for key in sorted(calls):
        tests = tuple(dict.fromkeys(applies[key]))
        for rule_id, line in _call_ids(calls[key], path, problems):
            citations.append(Citation(rule_id, path, line, tests))
    return citations, problems


def conformance_test_files() -> list[Path]:
    """The conformance test modules, ``conformance/**/test_*.py`` outside ``meta``."""
    return sorted(
        path
        for path in CONFORMANCE_DIR.rglob("test_*.py")
        if META_DIR not in path.resolve().parents and "__pycache__" not in path.parts
    )


def load_tests() -> Citations:
    """Read the citations of every conformance test module."""
    citations: list[Citation] = []
    problems: list[str] = []
    for path in conformance_test_files():
        file_citations, file_problems = parse_test_file(path)
        citations.extend(file_citations)
        problems.extend(file_problems)
    return Citations(tuple(citations), tuple(problems))
