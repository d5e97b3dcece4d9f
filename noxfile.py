"""Nox sessions: the checks CI runs (conformance, typecheck, lint, docs, install) and the demo.

Every session runs in ONE shared virtual environment, ``.venv`` at the root of the checkout
(``SHARED``), which ``./nox`` makes on first use and runs nox from; nox run in another way
makes it too. It holds torch, Mujou (editable) with the extras of ``EXTRAS``, and nox: one
torch for all the sessions, installed once. Its torch is the CPU build unless there is a GPU
(``nvidia-smi``) or ``MUJOU_TORCH=cuda`` says otherwise (see ``torch_install_args``); to
change it later, delete ``.venv``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import nox

TORCH = "torch==2.13.0"
#: Where the CPU build of torch comes from on Linux, where a bare ``torch`` is the CUDA build.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: The extras of Mujou that the shared environment installs, for every session: a session
#: needing another extra gets it by adding the extra here.
EXTRAS = ("test", "typing", "lint", "docs", "plot", "record", "ray")
#: What the sessions need beside Mujou's extras: nox (typecheck reads noxfile.py) and build.
TOOLS = ("nox", "build")
REPO = Path(__file__).resolve().parent
#: The environment every session runs in (``./nox`` runs nox from it).
SHARED = REPO / ".venv"
#: What was installed into SHARED, to install nothing when nothing changed.
STAMP = SHARED / "mujou-nox.json"
#: Without numpy, importing torch prints a warning of its own.
NUMPY = "numpy"
#: Warnings are errors where the sessions run the README's code, as a user would see them.
NO_WARNINGS = ("-W", "error")
nox.options.sessions = ["conformance", "typecheck", "lint", "docs", "install"]


def python_of(venv: Path) -> Path:
    """The interpreter of a virtual environment."""
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def torch_variant() -> str:
    """``cpu`` or ``cuda``: ``MUJOU_TORCH`` when set, else ``cuda`` where ``nvidia-smi`` is."""
    wanted = os.environ.get("MUJOU_TORCH", "").strip().lower()
    if wanted in {"cpu", "cuda"}:
        return wanted
    if wanted:
        raise ValueError(f"MUJOU_TORCH={wanted!r}: use cpu or cuda (unset: cuda where nvidia-smi is)")
    return "cuda" if shutil.which("nvidia-smi") else "cpu"


def torch_install_args(python: Path, variant: str) -> list[str]:
    """The arguments of ``pip install`` that install ``TORCH`` of ``variant`` with ``python``.

    The CUDA build, and any build off Linux, is PyPI's. The CPU build on Linux comes from
    pip's own settings when they already provide ``TORCH`` without an index (installed, or in
    a ``find-links`` folder: a dry run with ``--no-index`` says so in a second), else from
    PyTorch's CPU index.
    """
    if variant == "cuda" or not sys.platform.startswith("linux"):
        return [TORCH]
    probe = [str(python), "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index", "--quiet", TORCH]
    if subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return [TORCH]
    return [TORCH, "--index-url", TORCH_CPU_INDEX]


def shared_python(session: nox.Session) -> str:
    """The interpreter of the shared environment, made and brought up to date first.

    Installs torch, then Mujou editable with ``EXTRAS``, then ``TOOLS``, when ``STAMP`` says
    that pyproject.toml, ``EXTRAS`` or the torch build changed since the last install.
    """
    python = python_of(SHARED)
    if not python.exists():
        session.run(sys.executable, "-m", "venv", str(SHARED))
    variant = torch_variant()
    wanted = {
        "pyproject": hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest(),
        "extras": sorted(EXTRAS),
        "tools": sorted(TOOLS),
        "torch": variant,
    }
    try:
        done = json.loads(STAMP.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        done = None
    if done != wanted:
        pip = (str(python), "-m", "pip", "install", "--quiet")
        session.run(*pip, *torch_install_args(python, variant), NUMPY)
        session.run(*pip, "-e", f".[{','.join(EXTRAS)}]", *TOOLS)
        STAMP.write_text(json.dumps(wanted), encoding="utf-8")
    return str(python)


@nox.session(venv_backend="none")
def conformance(session: nox.Session) -> None:
    """The conformance suite, the rule check (conformance/meta) and the unit tests, in parallel.

    The results go to docs/_build/junit.xml, which the docs' traceability page shows.
    """
    python = shared_python(session)
    junit = "--junitxml=docs/_build/junit.xml"
    session.run(python, "-m", "pytest", "-n", "auto", junit, *session.posargs)


@nox.session(venv_backend="none")
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the package, the suite, the examples and this file."""
    session.run(shared_python(session), "-m", "mypy", "--strict")


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """ruff (pinned by the ``lint`` extra: formatting changes between releases)."""
    python = shared_python(session)
    session.run(python, "-m", "ruff", "check", ".")
    session.run(python, "-m", "ruff", "format", "--check", ".")


@nox.session(venv_backend="none")
def docs(session: nox.Session) -> None:
    """Build the docs site in English and in Japanese; any warning fails the build."""
    python = shared_python(session)
    for language in ("en", "ja"):
        session.run(
            python,
            "-m",
            "sphinx",
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


@nox.session(venv_backend="none")
def examples(session: nox.Session) -> None:
    """Run every example to completion, show what each printed, and check it.

    Each example runs as its own process (tests/test_examples.py); ``-rA`` shows the output
    of each, passed or failed, under its test's name. A failing example fails the session.
    """
    python = shared_python(session)
    session.run(python, "-m", "pytest", "-n", "auto", "-rA", "tests/test_examples.py", *session.posargs)


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
    allowed.add("setup.py")  # the opt-in compiled build (MUJOU_COMPILE=1); pure Python without it
    problems += [
        f"the sdist holds {name}, which is not the package's source"
        for name in sorted(in_sdist)
        if name and (name.split("/")[0] not in allowed or "__pycache__" in name)
    ]
    return problems


@nox.session(venv_backend="none")
def install(session: nox.Session) -> None:
    """Install Mujou as the README says, in a fresh venv, and run the README's first net.

    Builds the sdist and, from it, the wheel (``python -m build``) and checks what each holds;
    then, in a temporary folder outside the checkout, makes a fresh venv (``python -m venv``),
    installs ``TORCH`` (the build the shared environment has) and numpy into it first, then
    the wheel (not the checkout, not editable), and runs the first python block of README.md
    there with warnings as errors: the code imports the installed wheel, and the README cannot
    drift from what works. The folder is removed at the end (kept when a step fails).
    """
    shared = shared_python(session)
    tmp = Path(tempfile.mkdtemp(prefix="mujou-install-"))
    session.log(f"working in {tmp}")
    dist = tmp / "dist"
    session.run(shared, "-m", "build", "--outdir", str(dist), str(REPO))
    (sdist,) = dist.glob("mujou-*.tar.gz")
    (wheel,) = dist.glob("mujou-*.whl")
    version = wheel.name.split("-")[1]
    problems = dist_problems(sdist, wheel, version)
    if problems:
        session.error("the distributions are wrong:\n  " + "\n  ".join(problems))

    venv = tmp / "venv"
    session.run(shared, "-m", "venv", str(venv))
    python = str(python_of(venv))
    pip = (python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check")
    session.run(*pip, *torch_install_args(python_of(venv), torch_variant()), NUMPY)
    session.run(*pip, str(wheel))

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
    # PYTHONPATH would let the checkout shadow the installed wheel.
    clean = {"PYTHONPATH": None}
    session.run(python, *NO_WARNINGS, "-c", check, env=clean)
    out = session.run(python, "-m", "mujou", "--version", silent=True, env=clean)
    if not isinstance(out, str) or out.strip() != f"mujou {version}":
        session.error(f"python -m mujou --version printed {out!r}, expected 'mujou {version}'")
    script = work / "first_net.py"
    script.write_text(first_python_block((REPO / "README.md").read_text(encoding="utf-8")))
    session.run(python, *NO_WARNINGS, str(script), env=clean)
    session.chdir(REPO)
    shutil.rmtree(tmp)


#: What the compiled session leaves out of its copy of the checkout: environments, caches, builds.
COPY_IGNORES: tuple[str, ...] = (".git", ".venv", ".nox", ".mypy_cache", ".ruff_cache", ".pytest_cache")
COPY_IGNORES += ("__pycache__", "build", "_build", "bench-results", "*.so")


@nox.session(venv_backend="none")
def compiled(session: nox.Session) -> None:
    """The whole suite against the compiled build (``MUJOU_COMPILE=1``, setup.py).

    Copies the checkout to a temporary folder, compiles setup.py's ``COMPILED`` modules in
    place there with mypyc (mypy, from the ``typing`` extra) and the machine's C compiler,
    checks that the copy's ``mujou`` loads them, and runs the suite in the copy (arguments go
    to pytest). The checkout itself stays pure Python, as every other session and CI use it.
    The folder is removed at the end (kept when a step fails).
    """
    python = shared_python(session)
    tmp = Path(tempfile.mkdtemp(prefix="mujou-compiled-"))
    copy = tmp / "mujou"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(*COPY_IGNORES))
    session.chdir(copy)
    here = {"PYTHONPATH": str(copy)}  # the copy's mujou, not the checkout's editable install
    session.run(python, "setup.py", "--quiet", "build_ext", "--inplace", env={**here, "MUJOU_COMPILE": "1"})
    check = (
        "import mujou._engine._update as update\n"
        "assert not update.__file__.endswith('.py'), update.__file__\n"
        "print('compiled:', update.__file__)\n"
    )
    session.run(python, "-c", check, env=here)
    session.run(python, "-m", "pytest", "-n", "auto", *session.posargs, env=here)
    session.chdir(REPO)
    shutil.rmtree(tmp)


@nox.session(venv_backend="none")
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
    python = shared_python(session)
    env = {"MUJOU_CHAOS_TRIALS": str(options.trials), "MUJOU_CHAOS_SEED": str(options.seed)}
    session.run(python, "-m", "pytest", "-n", "2", "conformance/test_chaos.py", *rest, env=env)


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Mujou and its peers side by side (see bench/RESULTS.md): about 24 minutes on 2 cores.

    ``nox -s bench -- --quick`` takes about 7 minutes. The results go to bench-results/. The
    peers are installed into the shared environment, where they install (the table says "not
    installable here" otherwise); the CUDA runtime wheel lets Holoscan load without a GPU.
    """
    python = shared_python(session)
    pip = (python, "-m", "pip", "install", "--quiet")
    session.run(*pip, "ezmsg", success_codes=[0, 1])
    session.run(*pip, "h5py", success_codes=[0, 1])  # the record rows' rosbag2-like peer
    session.run(*pip, "holoscan", "nvidia-cuda-runtime-cu12", success_codes=[0, 1])
    session.run(python, "bench/run.py", *session.posargs)


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """The CUDA tests, on a machine with a GPU (the shared environment has the CUDA build there)."""
    python = shared_python(session)
    has_cuda = session.run(python, "-c", "import torch; print(torch.cuda.is_available())", silent=True)
    if not isinstance(has_cuda, str) or has_cuda.strip() != "True":
        session.error(
            "torch in .venv sees no CUDA device: on a machine with a GPU, delete .venv and run "
            "again (with MUJOU_TORCH=cuda where nvidia-smi is missing)"
        )
    session.run(python, "-m", "pytest", "-m", "cuda", "conformance", *session.posargs)
    session.run(python, "bench/cuda_overlap.py")


@nox.session(venv_backend="none")
def rules(session: nox.Session) -> None:
    """Print which rules are tested, page by page."""
    session.run(shared_python(session), "conformance/meta/rules_report.py", *session.posargs)


@nox.session(venv_backend="none")
def demo(session: nox.Session) -> None:
    """Run the demo: a small robot net that prints what it does while it runs."""
    session.run(shared_python(session), "examples/demo.py")
