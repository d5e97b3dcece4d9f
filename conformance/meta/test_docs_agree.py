"""What the README and the spec show agrees with what Mujou does.

- The first net of the README and of the overview page (both languages) runs as shown, copied
  into a file of its own and run in a fresh interpreter from an empty folder, without a single
  warning: a user's first copy-paste must not be told that it oversubscribes the machine.
- The ``run.start`` rule lists every argument of ``mujou.run``, with its default, in both
  languages.
- No heading of the spec has an emoji as text: the navigation of the site (the sidebar, the
  tables of contents, the coverage table, the page's ``<title>``) shows a heading's text, and
  a browser whose fonts have no glyph for the emoji shows a box. An emoji of a title is an
  image (``![🧵](../_static/thread.svg)``), which the navigation leaves out;
  ``test_site.py`` checks the built site.

Like the rest of ``meta``, these tests are not marked with ``rule``.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _rules import LANGUAGES, REPO, SPEC_DIR, load_spec
from test_site import fenced_blocks

import mujou

#: The pages whose first python block is a whole program, a user's first copy-paste.
FIRST_NETS = [REPO / "README.md", *(SPEC_DIR / lang / "overview.md" for lang in LANGUAGES)]
#: How long one of them may take, in seconds (each runs for about two seconds).
TIMEOUT = 120
#: Emoji and other pictographs, which many fonts have no glyph for.
PICTOGRAPH = re.compile("[\U0001f000-\U0001faff]")
_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
_FENCE = re.compile(r"^(`{3,}|:{3,}|~{3,})")


def first_python_block(path: Path) -> str:
    """The code of the first ``python`` block of a Markdown page."""
    blocks = [block for block in fenced_blocks(path) if block.info == "python"]
    assert blocks, f"{path.relative_to(REPO)} has no python block"
    return blocks[0].code


@pytest.mark.parametrize("page", FIRST_NETS, ids=lambda path: path.relative_to(REPO).as_posix())
def test_the_first_net_runs_without_a_warning(page: Path, tmp_path: Path) -> None:
    """The first python block of ``page`` runs to its end, with every warning an error."""
    script = tmp_path / "first_net.py"
    script.write_text(first_python_block(page), encoding="utf-8")
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [environ.get("PYTHONPATH")])])
    environ.pop("PYTHONWARNINGS", None)
    done = subprocess.run(
        # Warnings are errors, but torch's own on import where numpy is missing (as pyproject.toml).
        [sys.executable, "-W", "error", "-W", "ignore:Failed to initialize NumPy:UserWarning", str(script)],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0 and done.stderr == "", (
        f"the first python block of {page.relative_to(REPO)} failed (status {done.returncode}):\n"
        f"{done.stdout}\n{done.stderr}"
    )
    assert done.stdout.startswith("tensor("), done.stdout  # it prints the smoother's mean


def _signature_of_run() -> str:
    """``mujou.run``'s parameters as the rule writes them: ``net, *, workers=None, ...``."""
    parts: list[str] = []
    for parameter in inspect.signature(mujou.run).parameters.values():
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and "*" not in parts:
            parts.append("*")
        name, default = parameter.name, parameter.default
        parts.append(name if default is inspect.Parameter.empty else f"{name}={default!r}")
    return ", ".join(parts)


@pytest.mark.parametrize("lang", LANGUAGES)
def test_run_start_lists_every_argument_of_run(lang: str) -> None:
    """The signature in the text of ``run.start`` is ``mujou.run``'s, argument for argument."""
    (rule,) = (rule for rule in load_spec(lang).pages["running"] if rule.id == "run.start")
    written = re.search(r"`mujou\.run\(([^`]*)\)`", rule.text)
    assert written is not None, f"{rule.location}: run.start writes no `mujou.run(...)`"
    assert " ".join(written.group(1).split()) == _signature_of_run(), (
        f"{rule.location}: run.start writes mujou.run({' '.join(written.group(1).split())}), "
        f"but mujou.run takes ({_signature_of_run()})"
    )


@pytest.mark.parametrize("lang", LANGUAGES)
def test_no_heading_has_an_emoji_as_text(lang: str) -> None:
    """A heading's emoji is an image, which the navigation leaves out, never a character."""
    found: list[str] = []
    for page in sorted((SPEC_DIR / lang).glob("*.md")):
        fence: str | None = None
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
            if match := _FENCE.match(line):
                marker = match.group(1)
                if fence is None:
                    fence = marker
                elif line.strip() == fence:
                    fence = None
                continue
            if fence is None and line.startswith("#") and PICTOGRAPH.search(_IMAGE.sub("", line)):
                found.append(f"{page.relative_to(REPO)}:{number}: {line}")
    assert not found, "headings with an emoji as text (make it an image):\n" + "\n".join(found)
