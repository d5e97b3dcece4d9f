"""Helpers for testing nets and nodes: a harness for one node, and the comparison of states.

``import mujou.testing`` (``import mujou`` does not import it). See the "Testing" page.
"""

from ._compare import assert_states_equal, state_difference
from ._harness import Harness

__all__ = ["Harness", "assert_states_equal", "state_difference"]

for _name in __all__:
    globals()[_name].__module__ = "mujou.testing"
del _name
