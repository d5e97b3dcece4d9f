"""Nox sessions: the checks CI runs (conformance, typecheck, lint, docs, install) and the demo.

Each session installs torch first (``TORCH``), then Mujou: a bare ``torch`` requirement would
resolve on Linux to a CUDA build of several GB. ``torch==2.13.0`` comes from pip's own index
settings: on Linux, ``PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu`` makes it the
CPU build (``2.13.0+cpu``), as on a machine whose pip finds that build on its disk.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path

import nox

TORCH = "torch==2.13.0"
REPO = Path(__file__).resolve().parent
#: Without numpy, importing torch prints a warning of its own.
NUMPY = "numpy"
#: Warnings are errors where the sessions run the README's code, as a user would see them.
NO_WARNINGS = ("-W", "error")
nox.options.sessions = ["conformance", "typecheck", "lint", "docs", "install"]
nox.options.reuse_existing_virtualenvs = True


def _install(session: nox.Session, extras: str) -> None:
    session.install(TORCH)
    session.install("-e", f".[{extras}]")


@nox.session
def conformance(session: nox.Session) -> None:
    """The conformance suite, the rule check (conformance/meta) and the unit tests, in parallel.

    The results go to docs/_build/junit.xml, which the docs' traceability page shows.
    """
    _install(session, "test,docs")
    session.run("pytest", "-n", "auto", "--junitxml=docs/_build/junit.xml", *session.posargs)


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the package, the suite, the examples and this file."""
    _install(session, "test,typing,docs")
    session.install("nox")
    session.run("mypy", "--strict")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint rules and formatting."""
    session.install("ruff==0.17.6")  # pinned: formatting changes between releases
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the spec site in English and in Japanese; any warning fails the build."""
    _install(session, "docs")
    for language in ("en", "ja"):
        session.run(
            "sphinx-build",
            "-nW",
            "--keep-going",
            "-b",
            "html",
            "-c",
            "docs",
            "-D",
            f"language={language}",
            f"spec/{language}",
            f"docs/_build/{language}",
        )


@nox.session
def examples(session: nox.Session) -> None:
    """Run every example to completion, show what each printed, and check it.

    Each example runs as its own process (tests/test_examples.py); ``-rA`` shows the output
    of each, passed or failed, under its test's name. A failing example fails the session.
    """
    _install(session, "test")
    session.install(NUMPY)
    session.run("pytest", "-n", "auto", "-rA", "tests/test_examples.py", *session.posargs)


def first_python_block(markdown: str) -> str:
    """The code of the first ``python`` fenced block of a Markdown text."""
    found = re.search(r"^```python\n(.*?)^```\s*$", markdown, re.DOTALL | re.MULTILINE)
    if found is None:
        raise ValueError("no ```python block found")
    return found.group(1)


def dist_problems(sdist: Path, wheel: Path, version: str) -> list[str]:
    """What the sdist or the wheel lacks or holds too much of: the wheel is the package only."""
    package = sorted(
        path.relative_to(REPO).as_posix()
        for path in (REPO / "mujou").rglob("*")
        if path.suffix == ".py" or path.name == "py.typed"
    )
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = set(archive.namelist())
    info = f"mujou-{version}.dist-info/"
    problems = [f"the wheel lacks {name}" for name in package if name not in in_wheel]
    problems += [
        f"the wheel holds {name}, which is not the package"
        for name in sorted(in_wheel)
        if not (name.startswith(("mujou/", info)) and "__pycache__" not in name)
    ]
    with tarfile.open(sdist) as archive:
        root = f"mujou-{version}/"
        in_sdist = {name.removeprefix(root) for name in archive.getnames() if name != root.rstrip("/")}
    needed = ["pyproject.toml", "README.md", "PKG-INFO", *package]
    problems += [f"the sdist lacks {name}" for name in needed if name not in in_sdist]
    # The package's source and what setuptools writes beside it (MANIFEST.in prunes tests/).
    allowed = {"mujou", "mujou.egg-info", "MANIFEST.in", "PKG-INFO", "README.md", "pyproject.toml"}
    allowed.add("setup.cfg")  # the egg_info options setuptools writes
    problems += [
        f"the sdist holds {name}, which is not the package's source"
        for name in sorted(in_sdist)
        if name and (name.split("/")[0] not in allowed or "__pycache__" in name)
    ]
    return problems


@nox.session
def install(session: nox.Session) -> None:
    """Install Mujou as the README says, in a fresh venv, and run the README's first net.

    Builds the sdist and, from it, the wheel (``python -m build``) and checks what each holds;
    then, in a temporary folder outside the checkout, makes a fresh venv (``python -m venv``),
    installs ``TORCH`` and numpy into it first, then the wheel (not the checkout, not
    editable), and runs the first python block of README.md there with warnings as errors:
    the code imports the installed wheel, and the README cannot drift from what works.
    """
    session.install("build")
    tmp = Path(tempfile.mkdtemp(prefix="mujou-install-"))  # left in place when a step fails
    session.log(f"working in {tmp}")
    dist = tmp / "dist"
    session.run("python", "-m", "build", "--outdir", str(dist), str(REPO))
    (sdist,) = dist.glob("mujou-*.tar.gz")
    (wheel,) = dist.glob("mujou-*.whl")
    version = wheel.name.split("-")[1]
    problems = dist_problems(sdist, wheel, version)
    if problems:
        session.error("the distributions are wrong:\n  " + "\n  ".join(problems))

    venv = tmp / "venv"
    session.run("python", "-m", "venv", str(venv))
    python = str(venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
    pip = (python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check")
    session.run(*pip, TORCH, NUMPY, external=True)
    session.run(*pip, str(wheel), external=True)

    work = tmp / "work"  # not the checkout: `import mujou` finds the installed wheel only
    work.mkdir()
    session.chdir(work)
    check = (
        "import importlib.metadata, pathlib, torch, mujou\n"
        f"venv = pathlib.Path({str(venv)!r}).resolve()\n"
        "where = pathlib.Path(mujou.__file__).resolve()\n"
        "assert venv in where.parents, f'mujou imported from {where}, not from the venv'\n"
        f"assert mujou.__version__ == importlib.metadata.version('mujou') == {version!r}, "
        "mujou.__version__\n"
        "print(f'mujou {mujou.__version__} from {where.parent}, torch {torch.__version__}')\n"
    )
    session.run(python, *NO_WARNINGS, "-c", check, external=True)
    out = session.run(python, "-m", "mujou", "--version", external=True, silent=True)
    if not isinstance(out, str) or out.strip() != f"mujou {version}":
        session.error(f"python -m mujou --version printed {out!r}, expected 'mujou {version}'")
    script = work / "first_net.py"
    script.write_text(first_python_block((REPO / "README.md").read_text(encoding="utf-8")))
    session.run(python, *NO_WARNINGS, str(script), external=True)
    session.chdir(REPO)
    shutil.rmtree(tmp)


@nox.session
def chaos(session: nox.Session) -> None:
    """The chaos suite alone (conformance/test_chaos.py), two trials at a time.

    ``nox -s chaos -- --trials N --seed S`` runs the trials of seeds S to S+N-1 (200 from 0
    unless told; the conformance session runs 12, one of each fault). Each trial is one fault
    in a random small net with processes, in an interpreter of its own; about 10 s each on 2
    cores. Other arguments go to pytest.
    """
    parser = argparse.ArgumentParser(prog="nox -s chaos --")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    options, rest = parser.parse_known_args(session.posargs)
    _install(session, "test")
    env = {"MUJOU_CHAOS_TRIALS": str(options.trials), "MUJOU_CHAOS_SEED": str(options.seed)}
    session.run("pytest", "-n", "2", "conformance/test_chaos.py", *rest, env=env)


@nox.session
def bench(session: nox.Session) -> None:
    """Mujou and its peers side by side (see bench/RESULTS.md): about 24 minutes on 2 cores.

    ``nox -s bench -- --quick`` takes about 7 minutes. The results go to bench-results/.
    """
    _install(session, "test")
    # The peers where they install (the table says "not installable here" otherwise); the
    # CUDA runtime wheel lets Holoscan load on a machine without a GPU.
    session.install("ezmsg", success_codes=[0, 1])
    session.install("holoscan", "nvidia-cuda-runtime-cu12", success_codes=[0, 1])
    session.run("python", "bench/run.py", *session.posargs)


@nox.session
def gpu(session: nox.Session) -> None:
    """The CUDA tests, on a machine with a GPU: installs torch's default (CUDA) build."""
    session.install("torch")
    session.install("-e", ".[test]")
    session.run("python", "-c", "import torch; assert torch.cuda.is_available(), 'no CUDA here'")
    session.run("pytest", "-m", "cuda", "conformance", *session.posargs)
    session.run("python", "bench/cuda_overlap.py")


@nox.session
def rules(session: nox.Session) -> None:
    """Print which rules are tested, page by page."""
    _install(session, "test")
    session.run("python", "conformance/meta/rules_report.py", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """Run the demo: a small robot net that prints what it does while it runs."""
    _install(session, "test")
    session.install(NUMPY)
    session.run("python", "examples/demo.py")
