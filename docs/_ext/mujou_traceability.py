"""The rule traceability page: every rule, its text, the tests citing it, and their last results.

In a MyST page::

    ```{rule-traceability}
    ```

renders, page by page of the spec in reading order, each rule: its ID (a link to the rule's
box), its text, and the conformance tests that cite it, each with its result in the last run
of the suite. The rules and citations are read with ``conformance/meta/_rules.py``, as the meta
tests and the rule boxes read them; the page is generated anew on every build.

The results come from the JUnit XML file that pytest writes with ``--junitxml`` (config value
``mujou_test_results``, a path relative to the repository root; by default
``docs/_build/junit.xml``; empty: no results). A test is "passed" when at least one of its
cases passed and none failed, "failed" when a case failed or errored, "skipped" when every case
was skipped, and "not run" when the file has no case of it, or when there is no file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

import _rules  # conformance/meta/_rules.py; docs/conf.py puts its folder on sys.path
from docutils import nodes
from mujou_rules import _sites, _tests, _words
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.typing import ExtensionMetadata

logger = logging.getLogger(__name__)
#: A Markdown image, ``![alt](path)``.
_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")

#: The words of the page, by language (the rule boxes' words are in mujou_rules.WORDS).
TRACE_WORDS: dict[str, dict[str, str]] = {
    "en": {
        "passed": "passed",
        "failed": "failed",
        "skipped": "skipped",
        "not-run": "not run",
        "cases": "{passed} of {total} cases passed, {skipped} skipped",
        "results": "Results of the last run of the test suite: `{file}`, run at {time}: "
        "{cases} test cases, {passed} passed, {failed} failed, {skipped} skipped, counted as "
        "pytest counts them (each parameter set of a test function is a case, and an error "
        "counts as a failure), in {tests} test functions.",
        "no-results": "No results of a run of the conformance suite were found (`{file}`), so "
        "every test shows “not run”. Run the suite with "
        "``pytest --junitxml=docs/_build/junit.xml`` before building the site.",
        "summary": "{rules} rules, {tested} of them cited by tests; {citing} test functions cite them.",
        "page-summary": "{rules} rules, {tested} with tests.",
        "failing": "Rules with a failing test:",
    },
    "ja": {
        "passed": "成功",
        "failed": "失敗",
        "skipped": "スキップ",
        "not-run": "未実行",
        "cases": "{total} ケース中 {passed} 成功、{skipped} スキップ",
        "results": "テストスイートの最後の実行の結果: `{file}`（{time} に実行）。テストケース "
        "{cases} 件、成功 {passed}、失敗 {failed}、スキップ {skipped}。pytest と同じ数え方で、"
        "テスト関数のパラメータの組の一つ一つを一ケースとし、エラーは失敗に数える。"
        "テスト関数は {tests} 件。",
        "no-results": "適合テストの実行結果が見つからない（`{file}`）ので、どのテストも「未実行」と示す。"
        "サイトを作る前に ``pytest --junitxml=docs/_build/junit.xml`` でテストを実行する。",
        "summary": "規則 {rules} 件、そのうちテストが引くもの {tested} 件。"
        "規則を引くテスト関数は {citing} 件。",
        "page-summary": "規則 {rules} 件、テストのあるもの {tested} 件。",
        "failing": "失敗したテストのある規則:",
    },
}

PASSED, FAILED, SKIPPED, NOT_RUN = "passed", "failed", "skipped", "not-run"


# --------------------------------------------------------------------------------------------
# The results of a run


@dataclass
class TestOutcome:
    """The cases of one test function (several when it is parametrized) in a run."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0

    @property
    def status(self) -> str:
        if self.failed:
            return FAILED
        if self.passed:
            return PASSED
        return SKIPPED if self.skipped else NOT_RUN


@dataclass
class Results:
    """The outcome of each test of a run, keyed by pytest node ID without parameters."""

    file: str
    timestamp: str
    outcomes: dict[str, TestOutcome] = field(default_factory=dict)

    def outcome(self, test: str) -> TestOutcome:
        return self.outcomes.get(test, TestOutcome())


def junit_test_id(classname: str, name: str) -> str:
    """The pytest node ID (without parameters) of a JUnit ``testcase``.

    pytest writes ``conformance/test_x.py::TestA::test_b[1]`` as
    ``classname="conformance.test_x.TestA" name="test_b[1]"``. The module is the longest
    prefix of ``classname`` that names a ``.py`` file under the repository, since a class name
    starts with a capital and a module path has no dots.
    """
    parts = classname.split(".")
    function = name.split("[", 1)[0]
    for cut in range(len(parts), 0, -1):
        module = "/".join(parts[:cut]) + ".py"
        if (_rules.REPO / module).is_file():
            return "::".join([module, *parts[cut:], function])
    # A module that is no longer there: the usual layout, classes starting with a capital.
    cut = next((i for i, part in enumerate(parts) if part[:1].isupper()), len(parts))
    return "::".join(["/".join(parts[:cut]) + ".py", *parts[cut:], function])


def parse_junit(path: Path, shown_as: str) -> Results:
    """Read a JUnit XML file written by ``pytest --junitxml``.

    Raises:
        ValueError: the file is not JUnit XML.
    """
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError as exc:
        raise ValueError(f"{shown_as} is not JUnit XML: {exc}") from None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    if root.tag not in {"testsuite", "testsuites"}:
        raise ValueError(f"{shown_as} is not JUnit XML: its root element is <{root.tag}>")
    timestamp = next((suite.get("timestamp", "") for suite in suites if suite.get("timestamp")), "")
    results = Results(shown_as, timestamp.split(".")[0].replace("T", " "))
    for case in root.iter("testcase"):
        test = junit_test_id(case.get("classname", ""), case.get("name", ""))
        outcome = results.outcomes.setdefault(test, TestOutcome())
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            outcome.failed += 1
        elif "skipped" in tags:
            outcome.skipped += 1
        else:
            outcome.passed += 1
    return results


def load_results(setting: str) -> tuple[Results | None, str]:
    """The results the config value names, or None; and how to name the file on the page."""
    if not setting:
        return None, "mujou_test_results = ''"
    path = Path(setting)
    if not path.is_absolute():
        path = _rules.REPO / path
    try:
        shown = path.resolve().relative_to(_rules.REPO).as_posix()
    except ValueError:
        shown = str(path)
    if not path.is_file():
        return None, shown
    return parse_junit(path, shown), shown


# --------------------------------------------------------------------------------------------
# The page


def _trace_docs(env: BuildEnvironment) -> set[str]:
    docs: set[str] | None = getattr(env, "mujou_trace_docs", None)
    if docs is None:
        docs = set()
        env.mujou_trace_docs = docs  # type: ignore[attr-defined]  # extensions keep data on env
    return docs


def _page_title(path: Path) -> str:
    """The words of a page's title, without its images (an emoji is one: see docs/README.md)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return " ".join(_IMAGE.sub("", line[2:]).split())
    return path.stem


def _box_id(rule_id: str) -> str:
    """The anchor of a rule on this page (the rule's own ID is its anchor on its page)."""
    return f"trace-{rule_id}"


def _badge(status: str, text: str) -> nodes.inline:
    return nodes.inline(text, text, classes=["mujou-status", f"mujou-status-{status}"])


class RuleTraceabilityDirective(SphinxDirective):
    """``{rule-traceability}``: every rule of the spec with its tests and their last results."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        _trace_docs(self.env).add(self.env.docname)
        lang = self.config.language
        words, trace = _words(self.env), TRACE_WORDS.get(lang, TRACE_WORDS["en"])
        spec = _rules.load_spec(lang)
        tested = _tests(self.env)
        try:
            results, shown = load_results(self.config.mujou_test_results)
        except ValueError as exc:
            raise self.error(str(exc)) from None

        output: list[nodes.Node] = []
        rules = [rule for page_rules in spec.pages.values() for rule in page_rules]
        citing = {test for rule in rules for test in tested.get(rule.id, [])}
        output.append(
            self._paragraph(
                trace["summary"].format(
                    rules=len(rules), tested=sum(rule.id in tested for rule in rules), citing=len(citing)
                )
            )
        )
        if results is None:
            output.append(self._paragraph(trace["no-results"].format(file=shown), "mujou-trace-results"))
        else:
            output.append(
                self._paragraph(
                    trace["results"].format(
                        file=results.file,
                        time=results.timestamp or "?",
                        cases=sum(o.passed + o.failed + o.skipped for o in results.outcomes.values()),
                        tests=len(results.outcomes),
                        passed=sum(o.passed for o in results.outcomes.values()),
                        failed=sum(o.failed for o in results.outcomes.values()),
                        skipped=sum(o.skipped for o in results.outcomes.values()),
                    ),
                    "mujou-trace-results",
                )
            )

        if results is not None:
            failing = [
                rule.id
                for rule in rules
                if any(results.outcome(test).status == FAILED for test in tested.get(rule.id, []))
            ]
            if failing:
                line = nodes.paragraph(classes=["mujou-trace-failing"])
                line += nodes.Text(trace["failing"] + " ")
                for index, rule_id in enumerate(failing):
                    if index:
                        line += nodes.Text(", ")
                    line += nodes.reference(
                        "", "", nodes.literal(rule_id, rule_id), refid=_box_id(rule_id), internal=True
                    )
                output.append(line)

        for page, page_rules in spec.pages.items():
            if not page_rules:
                continue
            section = nodes.section(ids=[nodes.make_id(f"trace-{page}")], names=[f"trace-{page}"])
            section += nodes.title("", _page_title(_rules.SPEC_DIR / lang / f"{page}.md"))
            summary = self._paragraph(
                trace["page-summary"].format(
                    rules=len(page_rules), tested=sum(rule.id in tested for rule in page_rules)
                )
            )
            section += summary
            for rule in page_rules:
                section += self._rule(rule, tested.get(rule.id, []), results, words, trace)
            output.append(section)
        return output

    def _paragraph(self, text: str, *classes: str) -> nodes.paragraph:
        paragraph = nodes.paragraph(classes=list(classes))
        paragraph.extend(self.parse_inline(text)[0])
        return paragraph

    def _rule(
        self,
        rule: _rules.Rule,
        tests: Iterable[str],
        results: Results | None,
        words: dict[str, str],
        trace: dict[str, str],
    ) -> nodes.container:
        box = nodes.container(classes=["mujou-trace-rule"], ids=[_box_id(rule.id)])
        head = nodes.paragraph(classes=["mujou-trace-id"])
        link = nodes.reference("", "", nodes.literal(rule.id, rule.id), internal=True)
        link["mujou_rule"] = rule.id  # its URI is set once every page has been read
        head += link
        tests = list(tests)
        outcomes = [(test, results.outcome(test) if results else TestOutcome()) for test in tests]
        if not tests:
            exempt = rule.id.startswith(_rules.UNTESTED_ALLOWED_PREFIXES)
            head += nodes.Text(" ")
            head += _badge("untested", words["exempt"] if exempt else words["untested"])
        else:
            for status in (FAILED, PASSED, SKIPPED, NOT_RUN):
                count = sum(outcome.status == status for _, outcome in outcomes)
                if count:
                    head += nodes.Text(" ")
                    head += _badge(status, f"{count} {trace[status]}")
        box += head
        text = nodes.container(classes=["mujou-trace-text"])
        text.extend(self.parse_text_to_nodes(rule.text))
        box += text
        if tests:
            listing = nodes.bullet_list(classes=["mujou-trace-tests"])
            for test, outcome in outcomes:
                item = nodes.list_item()
                line = nodes.paragraph()
                line += _badge(outcome.status, trace[outcome.status])
                line += nodes.Text(" ")
                shown = test.removeprefix("conformance/")
                line += nodes.literal(shown, shown)
                total = outcome.passed + outcome.failed + outcome.skipped
                if outcome.status == PASSED and total > 1 and outcome.skipped:
                    cases = trace["cases"].format(passed=outcome.passed, total=total, skipped=outcome.skipped)
                    line += nodes.Text(f" ({cases})")
                item += line
                listing += item
            box += listing
        return box


def _resolve_links(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """Point each rule ID of the page to the rule's box, wherever the build put it."""
    if docname not in _trace_docs(app.env):
        return
    sites = _sites(app.env)
    for link in list(doctree.findall(nodes.reference)):
        rule_id = link.get("mujou_rule")
        if rule_id is None:
            continue
        site = sites.get(rule_id)
        if site is None:
            logger.warning(
                "rule %r is in the spec but no page of this build defines it",
                rule_id,
                location=docname,
                type="mujou",
                subtype="trace-unknown-rule",
            )
            link.replace_self(link.children)
            continue
        link["refuri"] = app.builder.get_relative_uri(docname, site.docname) + "#" + rule_id
        del link["mujou_rule"]


def _check(app: Sphinx, env: BuildEnvironment) -> None:
    """Every rule the build defines is on the traceability page (it reads the same sources)."""
    if not _trace_docs(env):
        return
    listed = set(_rules.load_spec(env.config.language).ids())
    for rule_id, site in sorted(_sites(env).items()):
        if rule_id not in listed:
            logger.warning(
                "rule %r is not on the traceability page: the spec that _rules.py reads differs "
                "from this build's source folder",
                rule_id,
                location=(site.docname, site.line),
                type="mujou",
                subtype="trace-missing-rule",
            )


def _outdated(
    app: Sphinx, env: BuildEnvironment, added: set[str], changed: set[str], removed: set[str]
) -> list[str]:
    """The page is generated anew on every build: the spec, the tests or the results changed."""
    return sorted(_trace_docs(env) - removed)


def _purge(app: Sphinx, env: BuildEnvironment, docname: str) -> None:
    _trace_docs(env).discard(docname)


def _merge(app: Sphinx, env: BuildEnvironment, docnames: set[str], other: BuildEnvironment) -> None:
    _trace_docs(env).update(_trace_docs(other))


def setup(app: Sphinx) -> ExtensionMetadata:
    app.setup_extension("mujou_rules")
    app.add_config_value("mujou_test_results", "docs/_build/junit.xml", "env", types=frozenset({str}))
    app.add_directive("rule-traceability", RuleTraceabilityDirective)
    app.connect("env-get-outdated", _outdated)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("env-check-consistency", _check)
    app.connect("doctree-resolved", _resolve_links)
    return {"version": "1", "env_version": 1, "parallel_read_safe": True, "parallel_write_safe": True}
