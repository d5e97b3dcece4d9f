"""Print which rules of the spec the conformance tests cover; optionally write spec/rules.json.

Run from anywhere::

    python -m conformance.meta.rules_report            # from the repository root
    python conformance/meta/rules_report.py [--write]

``--write`` also writes ``spec/rules.json``: for each rule, its ID, page, the sha256 of its
English and Japanese text, and the tests that cite it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__:  # python -m conformance.meta.rules_report: _rules is beside this file
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from _rules import LANGUAGES, SPEC_DIR, Citations, Rule, Spec, load_spec, load_tests

RULES_JSON = SPEC_DIR / "rules.json"
RULES_JSON_VERSION = 1


def coverage_rows(spec: Spec, tests: Citations) -> list[tuple[str, int, int, list[str]]]:
    """Per page with rules: the page, its rules, how many are tested, the untested IDs."""
    tested = tests.tests_by_rule()
    rows: list[tuple[str, int, int, list[str]]] = []
    for page, rules in spec.pages.items():
        if not rules:
            continue
        uncovered = [rule.id for rule in rules if rule.id not in tested]
        rows.append((page, len(rules), len(rules) - len(uncovered), uncovered))
    return rows


def report(spec: Spec, tests: Citations) -> str:
    """The coverage table, then the untested rules of each page."""
    rows = coverage_rows(spec, tests)
    width = max([len("page"), *(len(row[0]) for row in rows)])
    lines = [f"{'page':<{width}}  rules  tested  uncovered"]
    for page, total, tested, uncovered in rows:
        lines.append(f"{page:<{width}}  {total:>5}  {tested:>6}  {len(uncovered):>9}")
    total = sum(row[1] for row in rows)
    tested_total = sum(row[2] for row in rows)
    lines.append(f"{'all':<{width}}  {total:>5}  {tested_total:>6}  {total - tested_total:>9}")
    for page, _, _, uncovered in rows:
        if uncovered:
            lines.append("")
            lines.append(f"uncovered in {page}:")
            lines.extend(f"  {rule_id}" for rule_id in uncovered)
    for problem in [*map(str, spec.problems), *tests.problems]:
        lines.append(f"problem: {problem}")
    return "\n".join(lines)


def rules_json(specs: dict[str, Spec], tests: Citations) -> dict[str, object]:
    """The content of spec/rules.json (rules in the order of the English spec)."""
    tested = tests.tests_by_rule()
    by_id: dict[str, dict[str, Rule]] = {}
    for lang, spec in specs.items():
        for rule in spec.rules():
            by_id.setdefault(rule.id, {})[lang] = rule
    entries: list[dict[str, object]] = []
    for rule in specs["en"].rules():
        entry: dict[str, object] = {"id": rule.id, "page": rule.page}
        for lang in LANGUAGES:
            other = by_id[rule.id].get(lang)
            entry[f"{lang}_sha256"] = other.sha256 if other else None
        entry["tests"] = tested.get(rule.id, [])
        entries.append(entry)
    return {"version": RULES_JSON_VERSION, "rules": entries}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--write", action="store_true", help=f"also write {RULES_JSON.relative_to(SPEC_DIR.parent)}"
    )
    args = parser.parse_args(argv)
    specs = {lang: load_spec(lang) for lang in LANGUAGES}
    tests = load_tests()
    print(report(specs["en"], tests))
    if args.write:
        text = json.dumps(rules_json(specs, tests), ensure_ascii=False, indent=2) + "\n"
        RULES_JSON.write_text(text, encoding="utf-8")
        print(f"\nwrote {RULES_JSON}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
