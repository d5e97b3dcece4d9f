"""The warning that names the attributes a node's default state leaves out, each once per class.

See state.default-node-state and rules.warnings-on-host.
"""

from __future__ import annotations

import threading
import warnings
import weakref

from ._errors import UnsavedAttributeWarning
from ._in_run import WarningQueue
from ._messages import with_article

_unsaved_lock = threading.Lock()
# (class, attribute) pairs already named in an UnsavedAttributeWarning: each is named once.
_unsaved_named: weakref.WeakKeyDictionary[type, set[str]] = weakref.WeakKeyDictionary()


def warn_unsaved(
    cls: type, name: str, hooks: WarningQueue | None, in_hook: bool, unsaved: list[tuple[str, object]]
) -> None:
    """Name the attributes the default state of node ``name`` (of class ``cls``) left out, each
    (per class) once.

    Called in one of the node's hooks (``in_hook``: by Mujou, on a worker, or on the host once
    the run has ended), the warning waits in ``hooks`` for the host's call
    (rules.warnings-on-host); called otherwise, the caller is the host.
    """
    with _unsaved_lock:
        named = _unsaved_named.setdefault(cls, set())
        new = [(key, value) for key, value in unsaved if key not in named]
        named.update(key for key, _ in new)
    if not new:
        return
    listed = ", ".join(f"{key!r} ({with_article(type(value).__name__)})" for key, value in new)
    keys = tuple(key for key, _ in new)
    message = (
        f"node {name!r} ({cls.__name__}) has attribute(s) {listed} that its default "
        "state_dict cannot keep: they are left out of its state, so a resumed run starts "
        f"without them; leave them out by name (state_exclude = {keys!r} on "
        f"{cls.__name__}) or give them state_dict and load_state_dict"
    )
    if hooks is not None and in_hook:
        hooks.queue_warning(UnsavedAttributeWarning, message)
    else:
        warnings.warn(message, UnsavedAttributeWarning, stacklevel=3)
