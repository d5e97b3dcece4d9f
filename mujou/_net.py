"""``Net``: a named tree of nodes and sub-nets, and the connections between their ports."""

from __future__ import annotations

from collections.abc import Iterator

from ._node import Node, _core, is_initialized, not_initialized_message
from ._port import M
from ._ports import Input, Output, link


class Net:
    """A container of nodes and sub-nets, registered by attribute, like ``torch.nn.Module``.

    Assign nodes and nets as attributes in ``__init__`` after ``super().__init__()``, and
    connect their ports with :meth:`connect`. See :ref:`net.register`.
    """

    _children: dict[str, Node | Net]
    _parent: Net | None
    _attr: str

    def __init__(self) -> None:
        object.__setattr__(self, "_children", {})
        object.__setattr__(self, "_parent", None)
        object.__setattr__(self, "_attr", "")

    def __setattr__(self, attr: str, value: object) -> None:
        children = self.__dict__.get("_children")
        if isinstance(value, Node | Net):
            if children is None:
                cls = type(self).__name__
                raise TypeError(
                    f"{cls} was not initialized as a mujou.Net: call super().__init__() "
                    f"at the start of {cls}.__init__, before assigning nodes"
                )
            self._adopt(attr, value)
        elif children is not None and attr in children:
            self._release(attr)
        object.__setattr__(self, attr, value)

    def __delattr__(self, attr: str) -> None:
        if attr in self.__dict__.get("_children", {}):
            self._release(attr)
        object.__delattr__(self, attr)

    def _adopt(self, attr: str, child: Node | Net) -> None:
        if isinstance(child, Node):
            if not is_initialized(child):
                raise TypeError(not_initialized_message(child))
            core = _core(child)
            parent, old_attr = core.parent, core.attr
        else:
            if "_children" not in child.__dict__:
                cls = type(child).__name__
                raise TypeError(
                    f"{cls} was not initialized as a mujou.Net: call super().__init__() "
                    f"at the start of {cls}.__init__"
                )
            parent, old_attr = child._parent, child._attr
            if child is self or any(net is child for net in self._ancestors()):
                raise ValueError(f"net {attr!r} cannot contain itself")
        if parent is not None:
            here = _path(self, attr)
            there = _path(parent, old_attr)
            raise ValueError(
                f"{type(child).__name__} is already registered as {there!r}; it cannot also "
                f"be {here!r}: a node or net belongs to one net, once"
            )
        if attr in self._children:
            self._release(attr)
        self._children[attr] = child
        if isinstance(child, Node):
            _core(child).parent, _core(child).attr = self, attr
        else:
            object.__setattr__(child, "_parent", self)
            object.__setattr__(child, "_attr", attr)

    def _release(self, attr: str) -> None:
        child = self._children.pop(attr)
        if isinstance(child, Node):
            core = _core(child)
            core.parent, core.attr = None, ""
        else:
            object.__setattr__(child, "_parent", None)
            object.__setattr__(child, "_attr", "")

    def _ancestors(self) -> Iterator[Net]:
        net = self._parent
        while net is not None:
            yield net
            net = net._parent

    @property
    def name(self) -> str:
        """The net's dotted path in the outermost net, "" for the outermost itself."""
        parts: list[str] = []
        net: Net = self
        while net._parent is not None:
            parts.append(net._attr)
            net = net._parent
        return ".".join(reversed(parts))

    def nodes(self) -> Iterator[Node]:
        """Every node of the net and its sub-nets, depth first, in registration order."""
        for child in self._children.values():
            if isinstance(child, Node):
                yield child
            else:
                yield from child.nodes()

    def connect(self, output: Output[M], input: Input[M]) -> None:
        """Connect ``output`` to ``input``: the input reads the output's latest message.

        An output may feed any number of inputs; an input has at most one source.
        See :ref:`net.connect` and :ref:`net.one-source`.

        Raises:
            TypeError: the arguments are not an output and an input of node instances.
            ValueError: the input already has a source, or the two declare messages that
                cannot match (see :ref:`net.typed-connect`).
        """
        if not isinstance(output, Output):
            raise TypeError(
                f"connect(output, input) takes an Output first, got {_kind(output)}"
                + (
                    " (the arguments are swapped)"
                    if isinstance(output, Input) and isinstance(input, Output)
                    else ""
                )
            )
        if not isinstance(input, Input):
            raise TypeError(f"connect(output, input) takes an Input second, got {_kind(input)}")
        for port in (output, input):
            if port._node is None:
                raise TypeError(
                    f"{type(port).__name__} {port.name!r} is the class attribute; "
                    "connect the ports of node instances (node.port)"
                )
        if input._source is not None:
            raise ValueError(
                f"input {input.name!r} already has the source {input._source.name!r}; "
                "an input has at most one source"
            )
        link(output, input)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} with {sum(1 for _ in self.nodes())} node(s)>"


def _path(net: Net, attr: str) -> str:
    prefix = net.name
    return f"{prefix}.{attr}" if prefix else attr


def _kind(value: object) -> str:
    if isinstance(value, Output | Input):
        return f"{type(value).__name__} {value.name!r}"
    return f"{type(value).__name__}: {value!r}"
