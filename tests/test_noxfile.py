"""The choice of torch build that the nox sessions install into the shared environment.

Without a GPU (no ``nvidia-smi``) the CPU build, unless ``MUJOU_TORCH`` says otherwise; the CPU
build from pip's own settings when they have it without an index (a machine with it on its
disk), else from PyTorch's CPU index. A fake interpreter stands in for the environment's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def noxfile(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    pytest.importorskip("nox")
    monkeypatch.syspath_prepend(str(REPO))
    import noxfile as module

    return module


def executable(path: Path, script: str) -> Path:
    path.write_text(f"#!/bin/sh\n{script}\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def test_the_build_is_cpu_without_a_gpu_cuda_with_one(
    noxfile: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MUJOU_TORCH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert noxfile.torch_variant() == "cpu"
    executable(tmp_path / "nvidia-smi", "exit 0")
    assert noxfile.torch_variant() == "cuda"
    monkeypatch.setenv("MUJOU_TORCH", "cpu")
    assert noxfile.torch_variant() == "cpu"
    monkeypatch.setenv("MUJOU_TORCH", "rocm")
    with pytest.raises(ValueError, match="MUJOU_TORCH='rocm': use cpu or cuda"):
        noxfile.torch_variant()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="off Linux, PyPI's torch is the CPU build")
def test_the_cpu_build_comes_from_the_cpu_index_unless_pip_has_it(
    noxfile: ModuleType, tmp_path: Path
) -> None:
    # The fake interpreter answers the dry run as pip would: it found torch or it did not.
    has_it = executable(tmp_path / "has-it", 'case "$*" in *--no-index*) exit 0;; esac; exit 3')
    lacks_it = executable(tmp_path / "lacks-it", 'case "$*" in *--no-index*) exit 1;; esac; exit 3')
    assert noxfile.torch_install_args(has_it, "cpu") == [noxfile.TORCH]
    assert noxfile.torch_install_args(lacks_it, "cpu") == [
        noxfile.TORCH,
        "--index-url",
        "https://download.pytorch.org/whl/cpu",
    ]
    assert noxfile.torch_install_args(lacks_it, "cuda") == [noxfile.TORCH]


def test_pip_here_has_the_cpu_build_offline(noxfile: ModuleType) -> None:
    """Where this suite runs with torch 2.13.0 installed, the probe finds it: no index is asked."""
    import torch

    if torch.__version__.split("+")[0] != noxfile.TORCH.split("==")[1]:
        pytest.skip(f"torch {torch.__version__} is not {noxfile.TORCH}")
    assert os.path.exists(sys.executable)
    assert noxfile.torch_install_args(Path(sys.executable), "cpu") == [noxfile.TORCH]


def test_the_launcher_says_what_is_missing(tmp_path: Path) -> None:
    """./nox with a Python older than 3.11, or one without the venv module, says what to do,
    and leaves no half-made .venv behind (which would make the next run fail differently)."""
    launcher = tmp_path / "nox"
    launcher.write_bytes((REPO / "nox").read_bytes())
    launcher.chmod(0o755)
    old = executable(tmp_path / "old-python", 'case "$1" in -c) exit 1;; esac; exit 0')
    done = subprocess.run(
        [str(launcher), "--list"],
        env={**os.environ, "PYTHON": str(old)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1 and "needs Python 3.11 or newer" in done.stderr, done
    # A Python whose `-m venv` makes the folder and fails, as Debian's without python3-venv.
    venvless = executable(
        tmp_path / "venvless-python", 'case "$1" in -c) exit 0;; -m) mkdir -p "$3/bin"; exit 1;; esac'
    )
    done = subprocess.run(
        [str(launcher), "--list"],
        env={**os.environ, "PYTHON": str(venvless)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1 and "sudo apt install python3-venv" in done.stderr, done
    assert not (tmp_path / ".venv").exists(), "a half-made .venv was left behind"
