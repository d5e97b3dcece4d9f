"""The ``rule`` directive of the Mujou spec, and the rule-to-test traceability it shows.

In a MyST page::

    :::{rule} threads.hooks-exclusive
    The hooks of one node never run at the same time; ...
    :::

renders the text in a box headed by its ID, a link to itself (like the Rust Reference's
``r[...]``), and registers the ID as a label, so that ``{ref}`threads.hooks-exclusive``` and
``[](#threads.hooks-exclusive)`` link to it from any page. The HTML anchor is the ID itself:
``threads-and-devices.html#threads.hooks-exclusive``. Under each rule, the box lists the
conformance tests that cite it (read with ``conformance/meta/_rules.py``, as the meta tests do).

A rule ID defined twice is an error that gives both locations.

``{rule-coverage}`` renders a table, per page, of the rules, the tested ones and the coverage.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import _rules  # conformance/meta/_rules.py; docs/conf.py puts its folder on sys.path
from docutils import nodes
from sphinx.application import Sphinx
from sphinx.domains.std import StandardDomain
from sphinx.environment import BuildEnvironment
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.typing import ExtensionMetadata

logger = logging.getLogger(__name__)

#: The words the rule boxes and the table use, by language.
WORDS: dict[str, dict[str, str]] = {
    "en": {
        "tested_by": "Tested by:",
        "untested": "No test yet.",
        "exempt": "No test yet (checked on a GPU).",
        "page": "Page",
        "rules": "Rules",
        "tested": "Tested",
        "uncovered": "Uncovered",
        "coverage": "Coverage",
        "all": "All pages",
    },
    "ja": {
        "tested_by": "テスト:",
        "untested": "テストはまだ無い。",
        "exempt": "テストはまだ無い（GPU で確かめる）。",
        "page": "ページ",
        "rules": "規則",
        "tested": "テスト済み",
        "uncovered": "未テスト",
        "coverage": "カバー率",
        "all": "全ページ",
    },
}


@dataclass(frozen=True)
class RuleSite:
    """Where a rule is defined in this build."""

    docname: str
    line: int


class rule_coverage(nodes.General, nodes.Element):  # noqa: N801 (docutils names nodes so)
    """Stands for the coverage table until every page has been read."""


def _sites(env: BuildEnvironment) -> dict[str, RuleSite]:
    """The rules of this build, by ID: kept in the environment, so across incremental builds."""
    sites: dict[str, RuleSite] | None = getattr(env, "mujou_rules", None)
    if sites is None:
        sites = {}
        env.mujou_rules = sites  # type: ignore[attr-defined]  # extensions keep data on env
    return sites


def _coverage_docs(env: BuildEnvironment) -> set[str]:
    docs: set[str] | None = getattr(env, "mujou_coverage_docs", None)
    if docs is None:
        docs = set()
        env.mujou_coverage_docs = docs  # type: ignore[attr-defined]  # as above
    return docs


def _tests(env: BuildEnvironment) -> dict[str, list[str]]:
    """The tests citing each rule, read once per build."""
    tested: dict[str, list[str]] | None = getattr(env.app, "mujou_tests", None)
    if tested is None:
        tested = _rules.load_tests().tests_by_rule()
        env.app.mujou_tests = tested  # type: ignore[attr-defined]  # one read per build
    return tested


def _words(env: BuildEnvironment) -> dict[str, str]:
    return WORDS.get(env.config.language, WORDS["en"])


def _duplicate(env: BuildEnvironment, rule_id: str, first: RuleSite, second: RuleSite) -> None:
    logger.error(
        "duplicate rule ID %r\n  first defined at:  %s:%d\n  defined again at:  %s:%d",
        rule_id,
        env.doc2path(first.docname),
        first.line,
        env.doc2path(second.docname),
        second.line,
        location=(second.docname, second.line),
        type="mujou",
        subtype="duplicate-rule",
    )


class RuleDirective(SphinxDirective):
    """``:::{rule} ID`` followed by the normative text of the rule."""

    required_arguments = 1
    optional_arguments = 0
    final_argument_whitespace = False
    has_content = True

    def run(self) -> list[nodes.Node]:
        rule_id = self.arguments[0]
        if not _rules.RULE_ID.match(rule_id):
            raise self.error(
                f"rule ID {rule_id!r} is not well formed: lowercase components joined by '.', "
                "hyphens inside a component, e.g. 'threads.hooks-exclusive'"
            )
        if not self.content:
            raise self.error(f"rule {rule_id!r} has no text")
        site = RuleSite(self.env.docname, self.lineno)
        sites = _sites(self.env)
        first = sites.get(rule_id)
        if first is not None and first != site:
            _duplicate(self.env, rule_id, first, site)
            return []
        sites[rule_id] = site

        box = nodes.container(classes=["mujou-rule"], ids=[rule_id])
        self.state.document.ids[rule_id] = box
        heading = nodes.paragraph(classes=["mujou-rule-id"])
        heading += nodes.reference("", "", nodes.literal(rule_id, rule_id), refid=rule_id, internal=True)
        box += heading
        box.extend(self.parse_content_to_nodes())
        box += self._tested_by(rule_id)

        std = self.env.get_domain("std")
        assert isinstance(std, StandardDomain)
        std.anonlabels[rule_id] = (self.env.docname, rule_id)
        std.labels[rule_id] = (self.env.docname, rule_id, rule_id)
        return [box]

    def _tested_by(self, rule_id: str) -> nodes.paragraph:
        words = _words(self.env)
        tests = _tests(self.env).get(rule_id, [])
        line = nodes.paragraph(classes=["mujou-rule-tests"])
        if not tests:
            exempt = rule_id.startswith(_rules.UNTESTED_ALLOWED_PREFIXES)
            line += nodes.Text(words["exempt"] if exempt else words["untested"])
            line["classes"].append("mujou-rule-untested")
            return line
        line += nodes.Text(words["tested_by"] + " ")
        for index, test in enumerate(tests):
            if index:
                line += nodes.Text(", ")
            shown = test.removeprefix("conformance/")
            line += nodes.literal(shown, shown)
        return line


class RuleCoverageDirective(SphinxDirective):
    """``{rule-coverage}``: the table of rules, tested rules and coverage, per page."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        _coverage_docs(self.env).add(self.env.docname)
        return [rule_coverage()]


def _coverage_table(app: Sphinx, fromdocname: str) -> nodes.table:
    env = app.env
    words = _words(env)
    tested = _tests(env)
    by_doc: dict[str, list[str]] = {}
    for rule_id, site in _sites(env).items():
        by_doc.setdefault(site.docname, []).append(rule_id)
    order = [page for page in _rules.page_order(env.config.language) if page in by_doc]
    order += sorted(set(by_doc) - set(order))

    headers = ["page", "rules", "tested", "uncovered", "coverage"]
    table = nodes.table(classes=["mujou-rule-coverage"])
    group = nodes.tgroup(cols=len(headers))
    table += group
    for _ in headers:
        group += nodes.colspec(colwidth=1)
    head = nodes.thead()
    group += head
    head += _row([nodes.Text(words[key]) for key in headers])
    body = nodes.tbody()
    group += body
    all_rules = all_tested = 0
    for docname in order:
        ids = by_doc[docname]
        count = sum(rule_id in tested for rule_id in ids)
        all_rules += len(ids)
        all_tested += count
        title = env.titles[docname].astext() if docname in env.titles else docname
        link = nodes.reference("", title, internal=True)
        link["refuri"] = app.builder.get_relative_uri(fromdocname, docname)
        body += _row([link, *_counts(len(ids), count)])
    body += _row([nodes.Text(words["all"]), *_counts(all_rules, all_tested)])
    return table


def _counts(rules: int, tested: int) -> list[nodes.Node]:
    percent = f"{100 * tested / rules:.0f} %" if rules else "-"
    return [nodes.Text(str(value)) for value in (rules, tested, rules - tested, percent)]


def _row(cells: list[nodes.Node]) -> nodes.row:
    row = nodes.row()
    for cell in cells:
        entry = nodes.entry()
        entry += nodes.paragraph("", "", cell)
        row += entry
    return row


def _resolve_coverage(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    for node in list(doctree.findall(rule_coverage)):
        node.replace_self(_coverage_table(app, docname))


def _outdated(
    app: Sphinx, env: BuildEnvironment, added: set[str], changed: set[str], removed: set[str]
) -> list[str]:
    """Pages to read again although their source did not change.

    The boxes show the citing tests, which live outside the spec: when they change, every
    page with rules is read again. The coverage table is recomputed on every build.
    """
    digest = hashlib.sha256(repr(sorted(_tests(env).items())).encode()).hexdigest()
    again = set(_coverage_docs(env))
    if getattr(env, "mujou_tests_digest", None) != digest:
        env.mujou_tests_digest = digest  # type: ignore[attr-defined]  # as in _sites
        again.update(site.docname for site in _sites(env).values())
    return sorted(again - removed)


def _purge(app: Sphinx, env: BuildEnvironment, docname: str) -> None:
    sites = _sites(env)
    for rule_id in [rule_id for rule_id, site in sites.items() if site.docname == docname]:
        del sites[rule_id]
    _coverage_docs(env).discard(docname)


def _merge(app: Sphinx, env: BuildEnvironment, docnames: set[str], other: BuildEnvironment) -> None:
    """Merge what a parallel reader found, reporting duplicates across its pages and ours."""
    sites = _sites(env)
    for rule_id, site in _sites(other).items():
        first = sites.get(rule_id)
        if first is not None and first != site:
            _duplicate(env, rule_id, first, site)
        else:
            sites[rule_id] = site
    _coverage_docs(env).update(_coverage_docs(other))


def setup(app: Sphinx) -> ExtensionMetadata:
    app.add_directive("rule", RuleDirective)
    app.add_directive("rule-coverage", RuleCoverageDirective)
    app.add_node(rule_coverage)
    app.connect("env-get-outdated", _outdated)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("doctree-resolved", _resolve_coverage)
    return {"version": "1", "env_version": 1, "parallel_read_safe": True, "parallel_write_safe": True}
