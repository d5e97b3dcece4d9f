"""The version of Mujou, in a module of its own: the modules that write it (a recording's
metadata, ``python -m mujou``) take it from here, not from the package, which imports them."""

#: The version of Mujou (PEP 440). The one place it is written: the package metadata
#: (pyproject.toml), the docs, ``mujou.__version__`` and ``python -m mujou --version`` take it
#: from here.
__version__ = "0.1.0"
