"""``python -m mujou`` as a user runs it: ``--help``, ``--version``, ``info`` and wrong arguments.

Each test runs the command in a child process with this checkout first on the path, and
checks the exit status and what goes to stdout and to stderr. ``conformance/test_observing.py``
checks the facts ``info`` reports; this file checks the command line around them and
``mujou.__version__``.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from _support import checkout_environ

import mujou

REPO_ROOT = Path(__file__).resolve().parent.parent
#: PEP 440's public version scheme (its appendix's regex, without the local part).
PEP_440 = re.compile(
    r"^([1-9][0-9]*!)?(0|[1-9][0-9]*)(\.(0|[1-9][0-9]*))*"
    r"((a|b|rc)(0|[1-9][0-9]*))?(\.post(0|[1-9][0-9]*))?(\.dev(0|[1-9][0-9]*))?$"
)


def python_m_mujou(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m mujou ARGS`` with this checkout's mujou and return its result."""
    environ = checkout_environ(quiet=True)  # torch's own warnings on import
    return subprocess.run(
        [sys.executable, "-m", "mujou", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=environ,
        check=False,
    )


@pytest.mark.rule("observe.info")
@pytest.mark.parametrize("args", [("--help",), ("-h",)], ids=" ".join)
def test_help_prints_the_usage_and_the_commands_and_exits_0(args: tuple[str, ...]) -> None:
    """> python -m mujou --help (or -h [...]) prints the usage and the commands [...] to stdout,
    with exit status 0."""
    result = python_m_mujou(*args)
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert result.stderr == "", result.stderr
    assert result.stdout.startswith("usage: python -m mujou"), result.stdout
    for word in ("info", "--version", "--help"):
        assert word in result.stdout, f"{word!r} not in the help:\n{result.stdout}"


@pytest.mark.rule("observe.info")
@pytest.mark.parametrize("args", [("info", "--help"), ("info", "-h")], ids=" ".join)
def test_help_after_a_command_prints_its_usage_and_exits_0(args: tuple[str, ...]) -> None:
    """> python -m mujou --help (or -h, also after a command) prints the usage [...] with exit
    status 0."""
    result = python_m_mujou(*args)
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert result.stderr == "", result.stderr
    assert result.stdout.startswith("usage: python -m mujou info"), result.stdout
    assert "--json" in result.stdout, result.stdout


@pytest.mark.rule("observe.info", "overview.version")
def test_version_prints_mujou_and_the_version_and_exits_0() -> None:
    """> python -m mujou --version prints mujou VERSION [...] to stdout, with exit status 0.

    > (overview.version) python -m mujou --version prints it after "mujou "."""
    result = python_m_mujou("--version")
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert result.stderr == "", result.stderr
    assert result.stdout == f"mujou {mujou.__version__}\n", result.stdout


@pytest.mark.rule("observe.info")
def test_info_shows_mujous_version() -> None:
    """> python -m mujou info prints Mujou's version, [...] --json [...] with the keys mujou
    (mujou.__version__), python, [...]."""
    text = python_m_mujou("info")
    data = python_m_mujou("info", "--json")
    assert text.returncode == 0 and data.returncode == 0, (text.stderr, data.stderr)
    info = json.loads(data.stdout)
    assert info["mujou"] == mujou.__version__, info
    first = text.stdout.splitlines()[0]
    assert first.split() == ["Mujou", mujou.__version__], text.stdout


#: Wrong command lines and a word the error on stderr must contain: the argument at fault.
WRONG = [
    ((), "COMMAND"),
    (("bogus",), "'bogus'"),
    (("--json",), "COMMAND"),
    (("--bogus", "info"), "--bogus"),
    (("info", "--bogus"), "--bogus"),
    (("info", "extra"), "extra"),
]


@pytest.mark.rule("observe.info")
@pytest.mark.parametrize(("args", "named"), WRONG, ids=[" ".join(args) or "nothing" for args, _ in WRONG])
def test_a_wrong_command_line_names_the_argument_and_exits_2(args: tuple[str, ...], named: str) -> None:
    """> python -m mujou with no command, an unknown command or an unknown option prints the
    usage and an error that names the argument to stderr, and exits with status 2."""
    result = python_m_mujou(*args)
    assert result.returncode == 2, (args, result.returncode, result.stdout, result.stderr)
    assert result.stdout == "", result.stdout
    assert result.stderr.startswith("usage: python -m mujou"), result.stderr
    error = result.stderr.splitlines()[-1]
    assert error.startswith("python -m mujou") and "error:" in error, result.stderr
    assert named in error, f"the error does not name {named!r}: {error!r}"


@pytest.mark.rule("overview.version")
def test_version_is_a_pep_440_string() -> None:
    """> mujou.__version__ is the version of Mujou, a string in the form of PEP 440."""
    version = mujou.__version__
    assert isinstance(version, str), type(version)
    assert PEP_440.match(version), f"{version!r} is not a PEP 440 version"


def _installed_from_this_checkout() -> bool:
    """Whether the installed distribution ``mujou`` is this checkout (``pip install [-e] .``)."""
    try:
        distribution = importlib.metadata.distribution("mujou")
    except importlib.metadata.PackageNotFoundError:
        return False
    direct = distribution.read_text("direct_url.json")
    if direct is None:
        return False
    url = urlparse(json.loads(direct).get("url", ""))
    return url.scheme == "file" and Path(unquote(url.path)).resolve() == REPO_ROOT


@pytest.mark.rule("overview.version")
@pytest.mark.skipif(
    not _installed_from_this_checkout(),
    reason="the installed mujou is not this checkout (nox -s install checks a built wheel)",
)
def test_version_is_the_installed_packages() -> None:
    """> It is the version of the installed package (importlib.metadata.version("mujou"))."""
    assert importlib.metadata.version("mujou") == mujou.__version__
