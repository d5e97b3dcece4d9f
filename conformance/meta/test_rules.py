"""Traceability between the spec and the conformance tests.

These are ordinary tests over the sources: the spec pages are read with the rule regex and the
test modules with :mod:`ast` (see ``_rules.py``), so the results do not depend on how
``pytest -n auto`` splits the suite. They are not marked with ``rule``: they check the spec,
they do not implement it.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from functools import cache

from _rules import (
    LANGUAGES,
    RULE_ID,
    SPEC_DIR,
    UNTESTED_ALLOWED_PREFIXES,
    Citations,
    Spec,
    load_spec,
    load_tests,
)

_FENCE = re.compile(r"^(`{3,}|~{3,})(.*)$")
_HEADING = re.compile(r"^(#{1,6})\s")


@cache
def _spec(lang: str) -> Spec:
    return load_spec(lang)


@cache
def _tests() -> Citations:
    return load_tests()


def _all_ids() -> list[str]:
    return _spec("en").ids()


def test_the_spec_has_rules() -> None:
    """Both languages have pages with rules (a guard against reading the wrong place)."""
    for lang in LANGUAGES:
        spec = _spec(lang)
        assert spec.pages, f"no pages found in {SPEC_DIR / lang}"
        assert spec.ids(), f"no rule found in {SPEC_DIR / lang}"


def test_rule_directives_are_well_formed() -> None:
    """Every rule directive opens with a parseable line, has a well-formed ID, text, an end."""
    problems = [str(problem) for lang in LANGUAGES for problem in _spec(lang).problems]
    assert not problems, "malformed rule directives:\n" + "\n".join(problems)
    for rule in _spec("en").rules():
        assert RULE_ID.match(rule.id), rule.location


def test_rule_ids_are_unique() -> None:
    """No rule ID is defined twice in one language."""
    for lang in LANGUAGES:
        rules = list(_spec(lang).rules())
        counts = Counter(rule.id for rule in rules)
        duplicates = [
            f"{rule_id}: " + ", ".join(rule.location for rule in rules if rule.id == rule_id)
            for rule_id, count in counts.items()
            if count > 1
        ]
        assert not duplicates, f"rule IDs defined more than once ({lang}):\n" + "\n".join(duplicates)


def test_languages_have_the_same_pages() -> None:
    """spec/en and spec/ja have the same page files."""
    en, ja = _spec("en"), _spec("ja")
    assert sorted(en.pages) == sorted(ja.pages), (
        f"only in spec/en: {sorted(set(en.pages) - set(ja.pages))}; "
        f"only in spec/ja: {sorted(set(ja.pages) - set(en.pages))}"
    )


def test_languages_have_the_same_rules_in_the_same_order() -> None:
    """Each page has the same rule IDs, in the same order, in both languages."""
    en, ja = _spec("en"), _spec("ja")
    differences: list[str] = []
    for page in sorted(set(en.pages) & set(ja.pages)):
        en_ids = [rule.id for rule in en.pages[page]]
        ja_ids = [rule.id for rule in ja.pages[page]]
        if en_ids != ja_ids:
            diff = difflib.unified_diff(
                en_ids, ja_ids, f"spec/en/{page}.md", f"spec/ja/{page}.md", lineterm=""
            )
            differences.append("\n".join(diff))
    assert not differences, "the two languages disagree on their rules:\n" + "\n\n".join(differences)


def _skeleton(lang: str, page: str) -> tuple[list[str], list[str]]:
    """The heading levels and the code blocks (not directives such as toctree) of a page."""
    headings: list[str] = []
    blocks: list[str] = []
    lines = (SPEC_DIR / lang / f"{page}.md").read_text(encoding="utf-8").splitlines()
    fence: str | None = None
    is_code = False
    block: list[str] = []
    for line in lines:
        if fence is None:
            if match := _FENCE.match(line):
                fence, block = match.group(1), [line]
                is_code = not match.group(2).startswith("{")
            elif heading := _HEADING.match(line):
                headings.append(heading.group(1))
        elif line.strip() == fence:
            if is_code:
                blocks.append("\n".join([*block, line]))
            fence = None
        else:
            block.append(line)
    return headings, blocks


def test_languages_have_the_same_headings_and_code() -> None:
    """Each page has the same heading levels and identical code blocks in both languages."""
    en, ja = _spec("en"), _spec("ja")
    for page in sorted(set(en.pages) & set(ja.pages)):
        en_headings, en_code = _skeleton("en", page)
        ja_headings, ja_code = _skeleton("ja", page)
        assert en_headings == ja_headings, (
            f"{page}.md: heading levels differ: en {en_headings}, ja {ja_headings}"
        )
        for index, (en_block, ja_block) in enumerate(zip(en_code, ja_code, strict=False)):
            assert en_block == ja_block, f"{page}.md: code block {index + 1} differs:\n" + "\n".join(
                difflib.unified_diff(en_block.splitlines(), ja_block.splitlines(), "en", "ja", lineterm="")
            )
        assert len(en_code) == len(ja_code), (
            f"{page}.md: {len(en_code)} code blocks in en, {len(ja_code)} in ja"
        )


def test_test_sources_cite_rules_correctly() -> None:
    """Every test module parses, and cites rules as string literals on collected tests."""
    problems = _tests().problems
    assert not problems, "problems in the test sources:\n" + "\n".join(problems)


def test_cited_rules_exist() -> None:
    """Every rule ID a test cites is a rule of the spec."""
    known = set(_all_ids())
    unknown: list[str] = []
    for citation in _tests().citations:
        if citation.rule_id in known:
            continue
        close = difflib.get_close_matches(citation.rule_id, known, n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        unknown.append(f"{citation.location}: unknown rule {citation.rule_id!r}{hint}")
    assert not unknown, "tests cite rules that the spec does not have:\n" + "\n".join(unknown)


def test_untested_allowed_prefixes_name_rules() -> None:
    """Each exempt prefix still matches rules of the spec (a stale exemption is an error)."""
    ids = _all_ids()
    for prefix in UNTESTED_ALLOWED_PREFIXES:
        assert any(rule_id.startswith(prefix) for rule_id in ids), (
            f"UNTESTED_ALLOWED_PREFIXES has {prefix!r}, which matches no rule: remove it"
        )


def test_every_rule_has_a_test() -> None:
    """Every rule is cited by at least one test (except the exempt prefixes)."""
    tested = _tests().tests_by_rule()
    missing = [
        rule
        for rule in _spec("en").rules()
        if rule.id not in tested and not rule.id.startswith(UNTESTED_ALLOWED_PREFIXES)
    ]
    assert not missing, f"{len(missing)} rules have no test:\n" + "\n".join(
        f"{rule.id}  ({rule.location})" for rule in missing
    )
