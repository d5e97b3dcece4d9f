"""The user's guide: the pages the site opens on, before the specification.

- The index's first toctree is the guide, the same pages in both languages, and holds no rule:
  the guide is not normative. Every page with rules is in another toctree (the
  specification's).
- Each guide page's code runs as the page says, pasted in order into one file: a program
  prints what the page's ``text`` blocks show (the tutorial's blocks are run one by one by
  ``test_site.py``); a page whose code is a pytest module (it defines ``test_`` functions)
  passes under pytest. Every warning is an error, but the oversubscription warning, which
  depends on the machine's cores, and torch's own without numpy.

Like the rest of ``meta``, these tests are not marked with ``rule``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _rules import LANGUAGES, REPO, RULE_ATTEMPT, SPEC_DIR, guide_pages, parse_spec_page, toctrees
from test_site import fenced_blocks

#: How long one page's program may take, in seconds (each takes a few).
TIMEOUT = 300
#: Run a file as ``__main__`` (so that a process started with ``spawn`` imports it again)
#: with every warning an error, but those two.
_BOOT = (
    "import runpy, sys, warnings, mujou\n"
    "warnings.simplefilter('error')\n"
    "warnings.filterwarnings('ignore', 'Failed to initialize NumPy')\n"
    "warnings.simplefilter('ignore', mujou.OversubscriptionWarning)\n"
    "runpy.run_path(sys.argv[1], run_name='__main__')\n"
)


@pytest.mark.parametrize("lang", LANGUAGES)
def test_the_guide_is_the_first_toctree_and_has_no_rule(lang: str) -> None:
    guide = guide_pages(lang)
    assert guide == guide_pages("en"), f"spec/{lang}/index.md: the guide lists {guide}, not as en"
    assert {"install", "tutorial"} <= set(guide), guide
    for page in guide:
        path = SPEC_DIR / lang / f"{page}.md"
        rules, _ = parse_spec_page(path, lang)
        attempts = [
            line for line in path.read_text(encoding="utf-8").splitlines() if RULE_ATTEMPT.match(line)
        ]
        assert not rules and not attempts, f"{path.relative_to(REPO)} is a guide page and has rules"
    rest = {entry for toctree in toctrees(lang)[1:] for entry in toctree}
    for path in sorted((SPEC_DIR / lang).glob("*.md")):
        if parse_spec_page(path, lang)[0]:
            assert path.stem in rest, (
                f"{path.relative_to(REPO)} has rules and is in no toctree after the guide"
            )


def _program(page: str) -> tuple[str, str]:
    """The page's python blocks as one file, and what its text blocks show, in order."""
    blocks = fenced_blocks(SPEC_DIR / "en" / f"{page}.md")
    code = "\n".join(block.code for block in blocks if block.info == "python")
    shown = "".join(block.code for block in blocks if block.info == "text")
    return code, shown


GUIDE_PROGRAMS = [page for page in guide_pages("en") if page != "tutorial" and _program(page)[0]]


@pytest.mark.parametrize("page", GUIDE_PROGRAMS)
def test_guide_page_runs_as_shown(page: str, tmp_path: Path) -> None:
    code, shown = _program(page)
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [environ.get("PYTHONPATH")])])
    environ.pop("PYTHONWARNINGS", None)
    is_tests = re.search(r"^def test_", code, re.MULTILINE) is not None
    script = tmp_path / (f"test_{page.replace('-', '_')}.py" if is_tests else f"{page.replace('-', '_')}.py")
    script.write_text(code, encoding="utf-8")
    if is_tests:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
        command += ["-W", "error", "-W", "ignore::mujou.OversubscriptionWarning", script.name]
    else:
        command = [sys.executable, "-c", _BOOT, script.name]
    done = subprocess.run(
        command, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert done.returncode == 0, f"spec/en/{page}.md: its code failed:\n{done.stdout}\n{done.stderr}"
    if is_tests:
        assert re.search(r"^\d+ passed", done.stdout.splitlines()[-1]), done.stdout
        assert not shown, f"spec/en/{page}.md: a page of tests shows no output"
    else:
        assert done.stderr == "", f"spec/en/{page}.md: its code wrote to stderr:\n{done.stderr}"
        assert done.stdout == shown, (
            f"spec/en/{page}.md: the code printed\n{done.stdout}\nthe page shows\n{shown}"
        )
