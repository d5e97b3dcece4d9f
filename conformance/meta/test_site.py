"""The docs site: the tutorial's code runs as shown, and the built site has every rule.

- The python blocks of ``spec/en/tutorial.md`` run in order, in one namespace, in a fresh
  interpreter (the tutorial sets process-wide torch settings, as a program does), and each
  ``text`` block right after a python block is what that block prints. The Japanese page has
  the same blocks (``test_rules.py`` checks that every page pair has identical code blocks).
- The English site, built once into a temporary folder (with a made-up results file for the
  traceability page), has an anchor ``id="<rule-id>"`` for every rule on the rule's page, the
  traceability page lists every rule with its citing tests and their results, the API
  reference documents every public name, and every page links to the same page in Japanese.

The build is not run with ``-W``: the ``docs`` nox session is the gate for warnings, and this
test checks what the site contains. Both need the ``docs`` extra (``sphinx``, ``myst-parser``);
without it the site tests are skipped and say so. Like the rest of ``meta``, these tests are
not marked with ``rule``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import itertools
import json
import re
import subprocess
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from functools import cache
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from _rules import LANGUAGES, REPO, SPEC_DIR, Spec, load_spec, load_tests

DOCS_DIR = REPO / "docs"
TUTORIAL = SPEC_DIR / "en" / "tutorial.md"
#: How long the tutorial and a build of the site may take, in seconds (both take a few).
SUBPROCESS_TIMEOUT = 300

_FENCE = re.compile(r"^(`{3,})([^`\s]*)\s*$")
_AUTODOC = re.compile(r"^\s*\.\. auto(?:class|function|exception|data)::\s+mujou\.(\w+)\s*$", re.M)


@dataclass(frozen=True)
class Block:
    """A fenced block of a page."""

    info: str  # what follows the opening fence: "python", "text", "{eval-rst}", ...
    line: int  # the 1-based line of the first line of code
    code: str


def fenced_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a MyST page, in order."""
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    fence: str | None = None
    info, start = "", 0
    body: list[str] = []
    for number, line in enumerate(lines, start=1):
        if fence is None:
            if match := _FENCE.match(line):
                fence, info, start, body = match.group(1), match.group(2), number + 1, []
        elif line.strip() == fence:
            blocks.append(Block(info, start, "\n".join(body) + "\n"))
            fence = None
        else:
            body.append(line)
    return blocks


# --------------------------------------------------------------------------------------------
# The tutorial


def _run_tutorial_blocks(blocks: list[dict[str, Any]], source: str) -> list[dict[str, str]]:
    """Run the python blocks in one namespace; what each printed, or the error that stopped it.

    Runs in the subprocess that ``test_tutorial_runs_as_shown`` starts (``python test_site.py
    tutorial ...``), so that the tutorial's settings of the process stay there.
    """
    warnings.simplefilter("error")  # as pytest's filterwarnings = ["error"]
    warnings.filterwarnings("ignore", "Failed to initialize NumPy")  # torch without numpy
    from mujou import OversubscriptionWarning

    # Whether the run's threads fit the cores depends on the machine, not on the tutorial.
    warnings.simplefilter("ignore", OversubscriptionWarning)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    results: list[dict[str, str]] = []
    for block in blocks:
        # Line numbers in tracebacks are those of the page.
        code = compile("\n" * (block["line"] - 1) + block["code"], source, "exec")
        output = io.StringIO()
        try:
            with contextlib.redirect_stdout(output):
                exec(code, namespace)
        except BaseException:
            results.append({"output": output.getvalue(), "error": traceback.format_exc()})
            break
        results.append({"output": output.getvalue(), "error": ""})
    return results


def test_tutorial_runs_as_shown(tmp_path: Path) -> None:
    """The tutorial's python blocks run in order, and print what its text blocks show."""
    blocks = fenced_blocks(TUTORIAL)
    python = [block for block in blocks if block.info == "python"]
    assert python, f"{TUTORIAL} has no python block"
    # Each text block is the output of the python block right before it.
    expected: dict[int, Block] = {}
    for before, after in itertools.pairwise(blocks):
        if after.info == "text":
            assert before.info == "python", (
                f"{TUTORIAL.name}:{after.line}: a text block shows the output of the python "
                f"block right before it, but the block before it is {before.info!r}"
            )
            expected[before.line] = after
    assert blocks[0].info != "text", f"{TUTORIAL.name}:{blocks[0].line}: output without code"

    request = tmp_path / "blocks.json"
    request.write_text(json.dumps([{"line": b.line, "code": b.code} for b in python]), encoding="utf-8")
    answer = tmp_path / "outputs.json"
    process = subprocess.run(
        [sys.executable, __file__, "tutorial", str(request), str(answer), str(TUTORIAL)],
        cwd=tmp_path,  # the tutorial writes robot.pt and failed.pt where it runs
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        check=False,
    )
    assert process.returncode == 0 and answer.exists(), (
        f"the tutorial runner failed (exit {process.returncode}):\n{process.stdout}\n{process.stderr}"
    )
    outputs = json.loads(answer.read_text(encoding="utf-8"))
    for block, result in zip(python, outputs, strict=False):
        assert not result["error"], (
            f"{TUTORIAL.name}:{block.line}: the block raised:\n{result['error']}"
            f"\nprinted before:\n{result['output']}"
        )
        shown = expected.get(block.line)
        if shown is not None:
            assert result["output"] == shown.code, (
                f"{TUTORIAL.name}:{block.line}: the block printed\n{result['output']}"
                f"but the page shows (line {shown.line})\n{shown.code}"
            )
    assert len(outputs) == len(python), f"ran {len(outputs)} of {len(python)} blocks"


# --------------------------------------------------------------------------------------------
# The pages without a build


def test_api_pages_document_every_public_name() -> None:
    """Both API pages have an autodoc entry for each name of ``mujou.__all__``, and the same ones."""
    import mujou

    entries: dict[str, list[str]] = {}
    for lang in LANGUAGES:
        page = SPEC_DIR / lang / "api.md"
        entries[lang] = _AUTODOC.findall(page.read_text(encoding="utf-8"))
        missing = sorted(set(mujou.__all__) - set(entries[lang]))
        assert not missing, f"{page.relative_to(REPO)} has no autodoc entry for {missing}"
        unknown = sorted(set(entries[lang]) - set(mujou.__all__))
        assert not unknown, f"{page.relative_to(REPO)} documents names not in mujou.__all__: {unknown}"


@pytest.mark.parametrize("page", ["api", "traceability", "tutorial", "specification"])
def test_directive_blocks_are_the_same_in_both_languages(page: str) -> None:
    """The generated parts (autodoc, the traceability table) are the same blocks in en and ja."""
    en, ja = (
        [block for block in fenced_blocks(SPEC_DIR / lang / f"{page}.md") if block.info.startswith("{")]
        for lang in LANGUAGES
    )
    assert [(b.info, b.code) for b in en] == [(b.info, b.code) for b in ja], (
        f"{page}.md: the directive blocks differ between spec/en and spec/ja"
    )


# --------------------------------------------------------------------------------------------
# The built site


@dataclass
class _Element:
    tag: str
    classes: list[str]
    attrs: dict[str, str]
    text: list[str] = field(default_factory=list)
    children: list[_Element] = field(default_factory=list)

    def find(self, tag: str, cls: str | None = None) -> list[_Element]:
        """The descendants with ``tag`` (and class ``cls``), in document order."""
        found: list[_Element] = []
        for child in self.children:
            if child.tag == tag and (cls is None or cls in child.classes):
                found.append(child)
            found.extend(child.find(tag, cls))
        return found

    def all_text(self) -> str:
        return "".join(self.text) + "".join(child.all_text() for child in self.children)


class _Tree(HTMLParser):
    """A small element tree of an HTML page, and the ids and hrefs in it."""

    VOID = frozenset({"br", "hr", "img", "input", "link", "meta", "col", "area", "base", "wbr"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = _Element("root", [], {})
        self.stack = [self.root]
        self.ids: set[str] = set()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if "id" in values:
            self.ids.add(values["id"])
        if tag == "a" and "href" in values:
            self.hrefs.append(values["href"])
        element = _Element(tag, values.get("class", "").split(), values)
        self.stack[-1].children.append(element)
        if tag not in self.VOID:
            self.stack.append(element)

    def handle_endtag(self, tag: str) -> None:
        for index in range(len(self.stack) - 1, 0, -1):
            if self.stack[index].tag == tag:
                del self.stack[index:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].text.append(data)


def _parse(path: Path) -> _Tree:
    tree = _Tree()
    tree.feed(path.read_text(encoding="utf-8"))
    tree.close()
    return tree


def _junit_case(test: str, name_suffix: str, outcome: str) -> str:
    """A JUnit testcase for the pytest node ID ``test``, as ``pytest --junitxml`` writes it."""
    module, *rest = test.split("::")
    classname = ".".join([module.removesuffix(".py").replace("/", "."), *rest[:-1]])
    body = {
        "passed": "",
        "failed": '<failure message="boom">boom</failure>',
        "skipped": '<skipped type="pytest.skip" message="no GPU">no GPU</skipped>',
    }[outcome]
    return f'<testcase classname="{classname}" name="{rest[-1]}{name_suffix}" time="0.01">{body}</testcase>'


#: The made-up results of the build: test index in the sorted citing tests -> its cases.
_MADE_UP = {0: ["passed", "passed"], 1: ["passed", "failed"], 2: ["skipped"]}


@dataclass(frozen=True)
class Site:
    out: Path
    spec: Spec
    tests_by_rule: dict[str, list[str]]
    made_up: dict[str, str]  # test -> the status the page must show
    log: str


@cache
def _citing_tests() -> list[str]:
    return sorted({test for tests in load_tests().tests_by_rule().values() for test in tests})


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    """The English site, built once per worker into a folder of its own."""
    for module in ("sphinx", "myst_parser"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"building the site needs the docs extra ({module} is not installed)")
    root = tmp_path_factory.mktemp("site")
    citing = _citing_tests()
    assert len(citing) >= len(_MADE_UP), "too few citing tests to make up results for"
    cases: list[str] = []
    made_up: dict[str, str] = {}
    for index, outcomes in _MADE_UP.items():
        test = citing[index]
        for number, outcome in enumerate(outcomes):
            suffix = f"[{number}]" if len(outcomes) > 1 else ""
            cases.append(_junit_case(test, suffix, outcome))
        made_up[test] = "failed" if "failed" in outcomes else outcomes[0]
    junit = root / "junit.xml"
    junit.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
        '<testsuite name="pytest" timestamp="2026-01-02T03:04:05.678+00:00">'
        + "".join(cases)
        + "</testsuite></testsuites>",
        encoding="utf-8",
    )
    out = root / "en"
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-n",
            "--keep-going",
            "-q",
            "-b",
            "html",
            "-c",
            str(DOCS_DIR),
            "-d",
            str(root / "doctrees"),
            "-D",
            f"mujou_test_results={junit}",
            str(SPEC_DIR / "en"),
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        check=False,
    )
    assert process.returncode == 0, f"sphinx-build failed:\n{process.stdout}\n{process.stderr}"
    return Site(out, load_spec("en"), load_tests().tests_by_rule(), made_up, process.stderr)


def test_every_rule_has_its_anchor(site: Site) -> None:
    """Each rule's page in the built site has an element ``id="<rule-id>"``."""
    missing: list[str] = []
    for page, rules in site.spec.pages.items():
        if not rules:
            continue
        html = site.out / f"{page}.html"
        assert html.exists(), f"the build has no {html.name}; its log:\n{site.log}"
        ids = _parse(html).ids
        missing.extend(f"{rule.id} ({rule.location})" for rule in rules if rule.id not in ids)
    assert not missing, f"rules without an anchor in the built site (built in {site.out}):\n" + "\n".join(
        missing
    )


def test_traceability_page_lists_every_rule_with_its_tests(site: Site) -> None:
    """The traceability page has each rule, in the spec's order, linked to its anchor, with its
    citing tests and their results (from the made-up results file; the others "not run")."""
    tree = _parse(site.out / "traceability.html")
    listed: list[tuple[str, str, list[tuple[str, str]]]] = []
    for box in tree.root.find("div", "mujou-trace-rule"):
        link = box.find("a")[0]
        tests = []
        for item in box.find("li"):
            status = next(
                cls.removeprefix("mujou-status-")
                for span in item.find("span", "mujou-status")
                for cls in span.classes
                if cls.startswith("mujou-status-")
            )
            tests.append(("conformance/" + item.find("code")[0].all_text(), status))
        listed.append((link.all_text(), link.attrs.get("href", ""), tests))

    rules = list(site.spec.rules())
    assert [rule_id for rule_id, _, _ in listed] == [rule.id for rule in rules], (
        "the traceability page does not list the spec's rules in order: "
        f"missing {sorted({r.id for r in rules} - {i for i, _, _ in listed})}, "
        f"unexpected {sorted({i for i, _, _ in listed} - {r.id for r in rules})}"
    )
    for rule, (rule_id, href, tests) in zip(rules, listed, strict=True):
        assert href == f"{rule.page}.html#{rule_id}", f"{rule_id} links to {href!r}"
        cited = site.tests_by_rule.get(rule_id, [])
        assert [test for test, _ in tests] == cited, f"{rule_id}: listed {tests}, cited by {cited}"
        for test, status in tests:
            assert status == site.made_up.get(test, "not-run"), f"{rule_id}: {test} shows {status!r}"
    shown = {test: status for _, _, tests in listed for test, status in tests}
    for test, status in site.made_up.items():
        assert shown.get(test) == status, f"{test}: the page shows {shown.get(test)!r}, not {status!r}"


def test_traceability_page_counts_cases_as_pytest_does(site: Site) -> None:
    """The totals of the results are cases, as pytest counts them (a parameter set is one), and
    say how many test functions they belong to: 5 cases of 3 functions in the made-up file."""
    (line,) = _parse(site.out / "traceability.html").root.find("p", "mujou-trace-results")
    text = " ".join(line.all_text().split())
    cases = [outcome for outcomes in _MADE_UP.values() for outcome in outcomes]
    counts = {status: cases.count(status) for status in ("passed", "failed", "skipped")}
    expected = (
        f"{len(cases)} test cases, {counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['skipped']} skipped"
    )
    assert expected in text, text
    assert f"in {len(_MADE_UP)} test functions" in text, text


def test_api_reference_documents_every_public_name(site: Site) -> None:
    """The built API reference has an anchor ``mujou.<name>`` for each name of ``mujou.__all__``."""
    import mujou

    ids = _parse(site.out / "api.html").ids
    missing = [name for name in mujou.__all__ if f"mujou.{name}" not in ids]
    assert not missing, f"api.html documents no {missing}"


def test_every_page_links_to_the_other_language(site: Site) -> None:
    """Each page of the build links to the same page of the Japanese build, which exists."""
    pages = sorted(path.stem for path in (SPEC_DIR / "en").glob("*.md"))
    for page in pages:
        html = site.out / f"{page}.html"
        assert html.exists(), f"the build has no {html.name}"
        target = f"../ja/{page}.html"
        assert target in _parse(html).hrefs, f"{html.name} has no link to {target}"
        assert (SPEC_DIR / "ja" / f"{page}.md").exists(), f"{target} would have no page"


#: Emoji and other pictographs, which many fonts have no glyph for.
_PICTOGRAPH = re.compile("[\U0001f000-\U0001faff]")


def test_no_page_has_an_emoji_as_text(site: Site) -> None:
    """No built page has an emoji in its text (its title, the sidebar, the tables of contents,
    the coverage table): without a font that has it, a browser shows a box. The emoji of the
    title of "Threads and Devices" is an image in the page's heading, and only there."""
    found: dict[str, list[str]] = {}
    for html in sorted(site.out.glob("*.html")):
        text = _parse(html).root.all_text()
        if pictographs := sorted(set(_PICTOGRAPH.findall(text))):
            found[html.name] = pictographs
    assert not found, f"pages with an emoji as text: {found}"
    (body,) = _parse(site.out / "threads-and-devices.html").root.find("div", "body")
    (heading,) = body.find("h1")
    images = heading.find("img")
    assert [image.attrs.get("alt") for image in images] == ["\U0001f9f5"], heading
    assert (site.out / images[0].attrs["src"]).is_file(), images[0].attrs
    assert heading.all_text().strip().startswith("Threads and Devices"), heading.all_text()


if __name__ == "__main__":  # python test_site.py tutorial BLOCKS.json OUTPUTS.json SOURCE
    if len(sys.argv) == 5 and sys.argv[1] == "tutorial":
        _request, _answer, _source = (Path(arg) for arg in sys.argv[2:])
        _results = _run_tutorial_blocks(json.loads(_request.read_text(encoding="utf-8")), str(_source))
        _answer.write_text(json.dumps(_results), encoding="utf-8")
    else:
        sys.exit(f"usage: python {sys.argv[0]} tutorial BLOCKS.json OUTPUTS.json SOURCE")
