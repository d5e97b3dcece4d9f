"""Triggers: ``mujou.on`` and ``mujou.on_all``, the conditions that wake a node on its inputs.

A trigger names inputs of the node; the node's ``super().__init__(trigger=...)`` checks the
names against the node's ports. What a trigger does at run time is the engine's
(``_engine/_arrivals.py``); which nets are refused for a cycle of triggers is here
(``trigger_cycle``). See the "Triggers" page of the spec.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from ._numbers import positive


class Trigger:
    """When a node updates on its inputs: made by :func:`on` (any) or :func:`on_all` (all).

    Attributes:
        inputs: The names of the inputs (attribute names on the node class).
        all: Whether every input must have a new message (``on_all``) or any one (``on``).
        timeout: ``on_all`` only: timer seconds after the first new message at which the
            node updates anyway, or None to wait for all.
    """

    __slots__ = ("all", "inputs", "timeout")

    inputs: tuple[str, ...]
    all: bool
    timeout: float | None

    def __init__(self, inputs: tuple[str, ...], all: bool, timeout: float | None) -> None:
        object.__setattr__(self, "inputs", inputs)
        object.__setattr__(self, "all", all)
        object.__setattr__(self, "timeout", timeout)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a Trigger is immutable: make a new one with mujou.on or mujou.on_all ({name})")

    def __reduce__(self) -> tuple[type[Trigger], tuple[tuple[str, ...], bool, float | None]]:
        """Pickled as its three fields (a node's trigger goes with it into its process)."""
        return (Trigger, (self.inputs, self.all, self.timeout))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trigger):
            return NotImplemented
        return (self.inputs, self.all, self.timeout) == (other.inputs, other.all, other.timeout)

    def __hash__(self) -> int:
        return hash((self.inputs, self.all, self.timeout))

    def __repr__(self) -> str:
        names = ", ".join(map(repr, self.inputs))
        if not self.all:
            return f"on({names})"
        return f"on_all({names}{'' if self.timeout is None else f', timeout={self.timeout!r}'})"


def on(*inputs: str) -> Trigger:
    """Update the node when any of ``inputs`` has a new message. See :ref:`trigger.any`.

    Raises:
        TypeError: a name is not a str.
        ValueError: no name, or a name given twice (an unknown name is refused by the node).
    """
    return Trigger(_names("on", inputs), False, None)


def on_all(*inputs: str, timeout: float | None = None) -> Trigger:
    """Update the node when each of ``inputs`` has a new message since its last update, or
    ``timeout`` timer seconds after the first of them came. See :ref:`trigger.all`.

    Raises:
        TypeError: a name is not a str, or ``timeout`` is not a number.
        ValueError: no name, a name given twice, or ``timeout`` not finite and > 0.
    """
    names = _names("on_all", inputs)
    return Trigger(names, True, None if timeout is None else positive("timeout", timeout, optional=True))


def _names(what: str, inputs: tuple[object, ...]) -> tuple[str, ...]:
    if not inputs:
        raise ValueError(f"{what}() needs the names of one or more inputs, such as {what}('x')")
    for name in inputs:
        if not isinstance(name, str):
            raise TypeError(
                f"{what}() takes input names (str), got {type(name).__name__}: {name!r}; "
                "name the input by its attribute, such as 'x' for x = mujou.Input()"
            )
    names = tuple(name for name in inputs if isinstance(name, str))  # all of them: checked
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ValueError(f"{what}() names input {name!r} twice")
    return names


def check_trigger(
    cls: type, trigger: object, inputs: Sequence[str], outputs: Collection[str]
) -> Trigger | None:
    """``trigger`` for a node of class ``cls`` with ports ``inputs`` and ``outputs`` (their
    names): its names must be inputs."""
    if trigger is None:
        return None
    if not isinstance(trigger, Trigger):
        raise TypeError(
            "trigger must be None or made by mujou.on(...) or mujou.on_all(...), "
            f"got {type(trigger).__name__}: {trigger!r}"
        )
    for name in trigger.inputs:
        if name not in inputs:
            what = "an output" if name in outputs else "not a port"
            raise ValueError(
                f"trigger {trigger!r} names {name!r}, which is {what} of {cls.__name__}; a trigger "
                f"names inputs of the node: {', '.join(map(repr, sorted(inputs))) or 'it has none'}"
            )
    return trigger


def trigger_cycle(edges: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A cycle in ``edges`` (node name → the nodes it wakes at the next microstep), as the
    names along it with the first repeated at the end, or None. See :ref:`trigger.cycle`."""
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(edges, white)
    for root in edges:
        if colour[root] != white:
            continue
        path: list[str] = [root]
        stack = [iter(edges[root])]
        colour[root] = grey
        while stack:
            step = next(stack[-1], None)
            if step is None:
                stack.pop()
                colour[path.pop()] = black
                continue
            state = colour.get(step, black)
            if state == grey:
                return [*path[path.index(step) :], step]
            if state == white:
                colour[step] = grey
                path.append(step)
                stack.append(iter(edges.get(step, ())))
    return None
