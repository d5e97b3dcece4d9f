"""Nox sessions: the checks CI runs (conformance, typecheck, lint, docs) and the demo.

Each session installs the CPU build of torch first (``TORCH``), then Mujou: a bare
``torch`` requirement would resolve to a CUDA build of several GB.
"""

from __future__ import annotations

import nox

TORCH = "torch==2.13.0"
nox.options.sessions = ["conformance", "typecheck", "lint", "docs"]
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
    """Run every example to completion and check what it prints."""
    _install(session, "test")
    session.install("numpy")  # without it, importing torch prints a warning of its own
    session.run("pytest", "-n", "auto", "tests/test_examples.py", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Mujou and its peers side by side (see bench/RESULTS.md): about 13 minutes on 2 cores.

    ``nox -s bench -- --quick`` takes under 3 minutes. The results go to bench-results/.
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
    session.install("numpy")  # without it, importing torch prints a warning of its own
    session.run("python", "examples/demo.py")
