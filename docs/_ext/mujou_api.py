"""The API reference (``api.md``): what autodoc shows, and a check that it shows everything.

The page lists each public name and its public members explicitly, in an order chosen for the
reader, with autodoc directives nested in ``autoclass`` (so the order does not depend on the
version of Sphinx or on where the class is defined). This extension then checks, once every
page has been read, that the page documents every name of ``mujou.__all__`` and every public
member of each class (methods and properties, inherited ones included, unless a documented
base class shows them): a name added to the API without its entry fails the build.

It also hides the signature of the classes that have no public constructor (``Run``,
``Subscription``), whose ``__init__(*args, **kwargs)`` only raises.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from sphinx.application import Sphinx
from sphinx.domains.python import PythonDomain
from sphinx.environment import BuildEnvironment
from sphinx.util import logging
from sphinx.util.typing import ExtensionMetadata

logger = logging.getLogger(__name__)


def _guards_construction(cls: type) -> bool:
    """Whether ``cls.__init__`` is the ``(*args, **kwargs)`` guard of a class made by Mujou only."""
    init = cls.__dict__.get("__init__")
    if init is None or not inspect.isfunction(init):
        return False
    kinds = [parameter.kind for parameter in inspect.signature(init).parameters.values()][1:]
    return kinds == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]


def _signature(  # noqa: PLR0917 (the arguments of Sphinx's autodoc-process-signature)
    app: Sphinx,
    what: str,
    name: str,
    obj: Any,
    options: Any,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str, str | None] | None:
    """``autodoc-process-signature``: no signature for a class that cannot be constructed."""
    if what in {"class", "exception"} and inspect.isclass(obj) and _guards_construction(obj):
        return "", None
    return None


def public_members(cls: type, package: str) -> dict[str, type]:
    """The public methods and properties of ``cls``, each with the class of ``package`` defining it.

    Members that a class outside ``package`` defines (``object``, ``Exception``) are not
    Mujou's API; dataclass fields are documented by the class's docstring.
    """
    found: dict[str, type] = {}
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] != package:
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or name in found:
                continue
            if inspect.isfunction(value) or isinstance(value, property | classmethod | staticmethod):
                found[name] = klass
    return found


def missing_entries(package: str, documented: set[str]) -> list[str]:
    """The public names of ``package`` (``__all__`` and class members) missing from ``documented``."""
    module = importlib.import_module(package)
    missing: list[str] = []
    for name in module.__all__:
        qualified = f"{package}.{name}"
        if qualified not in documented:
            missing.append(qualified)
            continue
        obj = getattr(module, name)
        if not inspect.isclass(obj):
            continue
        for member, owner in public_members(obj, package).items():
            here = f"{qualified}.{member}"
            # An inherited member may be shown on a public base class instead (Timer.virtual).
            shown_on_base = [
                f"{package}.{base.__name__}.{member}"
                for base in obj.__mro__[1:]
                if issubclass(base, owner) and getattr(module, base.__name__, None) is base
            ]
            if here not in documented and not any(other in documented for other in shown_on_base):
                missing.append(here)
    return missing


def _check(app: Sphinx, env: BuildEnvironment) -> None:
    """``env-check-consistency``: the API page documents the whole public API."""
    docname: str = app.config.mujou_api_doc
    if docname not in env.found_docs:
        return
    domain = env.get_domain("py")
    assert isinstance(domain, PythonDomain)
    documented = set(domain.objects)
    for qualified in missing_entries(app.config.mujou_api_package, documented):
        logger.warning(
            "%s is public but the API reference does not document it: add its autodoc entry",
            qualified,
            location=docname,
            type="mujou",
            subtype="api-missing",
        )


def setup(app: Sphinx) -> ExtensionMetadata:
    app.add_config_value("mujou_api_doc", "api", "env", types=frozenset({str}))
    app.add_config_value("mujou_api_package", "mujou", "env", types=frozenset({str}))
    app.connect("autodoc-process-signature", _signature)
    app.connect("env-check-consistency", _check)
    return {"version": "1", "env_version": 1, "parallel_read_safe": True, "parallel_write_safe": True}
