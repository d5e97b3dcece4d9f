"""Sphinx configuration of the Mujou spec site, built once per language.

The source folder is the spec of one language and selects it; ``language`` must agree::

    sphinx-build -nW --keep-going -b html -c docs spec/en docs/_build/en
    sphinx-build -nW --keep-going -b html -c docs -D language=ja spec/ja docs/_build/ja

Each build links to the same page of the other one (``../ja/...`` from ``../en/...``), so
keep the two output folders side by side.

The API reference imports ``mujou`` (and so ``torch``) from this checkout. The traceability
page shows the results of the last run of the conformance suite when it finds them in
``docs/_build/junit.xml`` (``pytest --junitxml=docs/_build/junit.xml``; another file with
``-D mujou_test_results=PATH``).
"""

from __future__ import annotations

import ast
import sys
import warnings
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.errors import ConfigError

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
# The extensions, the rule parser they share with the meta tests, and the package autodoc
# reads (the checkout's, also when another version is installed).
sys.path[:0] = [str(DOCS / "_ext"), str(REPO / "conformance" / "meta"), str(REPO)]
# torch warns on import when numpy is missing, which the docs do not need (as in pyproject.toml).
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

LANGUAGES = {"en": "English", "ja": "日本語"}
TITLES = {"en": "Mujou documentation", "ja": "Mujou ドキュメント"}


def _version() -> str:
    """``mujou.__version__``, read from the source as pyproject.toml reads it (without torch)."""
    tree = ast.parse((REPO / "mujou" / "_version.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__version__" for target in node.targets
        ):
            value = ast.literal_eval(node.value)
            if isinstance(value, str):
                return value
    raise ConfigError("mujou/_version.py has no __version__ = '...'")


release = version = _version()

project = "Mujou"
author = "The Mujou authors"
copyright = "the Mujou authors"
language = "en"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "mujou_api",
    "mujou_rules",
    "mujou_traceability",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
myst_enable_extensions = ["colon_fence", "deflist"]
nitpicky = True

# The API reference (api.md): autodoc reads the docstrings, written in Google style.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True

# Types of the standard library and of torch that signatures and docstrings name. Without
# network access there are no intersphinx inventories to link them to: they stay plain text.
nitpick_ignore_regex = [
    ("py:.*", r"(collections\.abc|contextlib|os|pathlib|queue|types|typing)\.\w+"),
    ("py:.*", r"torch(\.\w+)+"),
    ("py:class", r"(mujou\._containers\.)?M"),  # the member type of NodeList and NodeDict
    ("py:class", r"mujou\._port\.M"),  # the type of a port's messages: a TypeVar, not a class
    ("py:class", r"mujou\._port\.PortNode"),  # port.node: a Node, typed by what a port sees of it
]

html_theme = "alabaster"
html_static_path = [str(DOCS / "_static")]
templates_path = [str(DOCS / "_templates")]
html_css_files = ["mujou.css"]
html_sidebars = {
    "**": ["about.html", "navigation.html", "relations.html", "mujou-languages.html", "searchbox.html"]
}
# Wide enough for code lines of about 90 characters without a scroll bar.
html_theme_options = {"description": "", "fixed_sidebar": True, "page_width": "1160px"}
html_show_sourcelink = False


def _select_language(app: Sphinx, config: Config) -> None:
    """Check that the source folder and ``language`` name the same spec; set the titles."""
    lang = Path(app.srcdir).name
    if lang not in LANGUAGES or config.language != lang:
        wanted = "" if lang == "en" else f" -D language={lang}"
        raise ConfigError(
            f"the source folder {str(app.srcdir)!r} and language={config.language!r} disagree: "
            f"build spec/<lang> with -D language=<lang>, e.g. "
            f"sphinx-build -c docs{wanted} spec/{lang if lang in LANGUAGES else 'ja'} ..."
        )
    config.html_title = f"{TITLES[lang]} {release}"
    config.html_short_title = TITLES[lang]
    config.html_context = {
        **config.html_context,
        "mujou_languages": [(code, name, code == lang) for code, name in LANGUAGES.items()],
    }


def setup(app: Sphinx) -> None:
    app.connect("config-inited", _select_language)
