"""``Net``: a named tree of nodes and sub-nets, and the connections between their ports.

A net, a :class:`~mujou.NodeList` and a :class:`~mujou.NodeDict` are the branches of the tree
(``Branch``); nodes are its leaves. A member's name is its path of keys from the outermost
branch, joined by ``"."``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from ._net_text import branch_text
from ._node import Node, Parent, _core, is_initialized, not_initialized_message
from ._port import M
from ._ports import Input, Output, link

_PLAIN_COLLECTIONS = (list, tuple, set, frozenset, dict)


class Branch:
    """What nets and node containers share: members by key, a parent, a name, the nodes.

    Each subclass keeps its members in its own way and lists them with ``_members``; the
    branch records where each member is (its parent and key) on the member itself.
    """

    _parent: Branch | None
    _attr: str
    _kind_name: ClassVar[str] = ""  # the public class: "Net", "NodeList", "NodeDict"

    def _init_branch(self) -> None:
        object.__setattr__(self, "_parent", None)
        object.__setattr__(self, "_attr", "")

    def _members(self) -> Iterator[tuple[str, Node | Branch]]:
        """The members by key, in registration order."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        """The dotted path in the outermost net, "" for the outermost itself."""
        parts: list[str] = []
        branch: Branch = self
        while branch._parent is not None:
            parts.append(branch._attr)
            branch = branch._parent
        return ".".join(reversed(parts))

    def nodes(self) -> Iterator[Node]:
        """Every node in it, also in sub-nets and containers, depth first, in registration order.

        See :ref:`net.nodes`.
        """
        for _, member in self._members():
            if isinstance(member, Node):
                yield member
            else:
                yield from member.nodes()

    def named_nodes(self) -> Iterator[tuple[str, Node]]:
        """``(name, node)`` for every node, in the order of :meth:`nodes`; names relative to it.

        The names are paths from this net or container; from the outermost net, each is the
        node's ``name``. See :ref:`net.nodes`.
        """
        for key, member in self._members():
            if isinstance(member, Node):
                yield key, member
            else:
                for name, node in member.named_nodes():
                    yield f"{key}.{name}", node

    # -- registering members ---------------------------------------------------------------

    def _check_member(self, key: str, value: object, what: str) -> Node | Branch:
        """``value`` if it may become this branch's member ``key``; else a clear error.

        ``what`` names the container's kind for the TypeError of a value that is no member.
        """
        if isinstance(value, Node):
            if not is_initialized(value):
                raise TypeError(not_initialized_message(value))
            core = _core(value)
            parent, old_key = core.parent, core.attr
        elif isinstance(value, Branch):
            if not _branch_initialized(value):
                raise TypeError(_branch_not_initialized_message(value))
            parent, old_key = value._parent, value._attr
            if value is self or any(branch is value for branch in self._ancestors()):
                raise ValueError(f"{_kind_of(value)} {path(self, key)!r} cannot contain itself")
        else:
            raise TypeError(
                f"{what} holds nodes, nets and node containers; {path(self, key)!r} "
                f"got {type(value).__name__}: {value!r}"
            )
        if parent is not None:
            raise ValueError(
                f"{type(value).__name__} is already registered as {path(parent, old_key)!r}; it "
                f"cannot also be {path(self, key)!r}: a node or net belongs to one net, once"
            )
        if _holds_running_node(value):
            raise RuntimeError(
                f"cannot register {path(self, key)!r}: its nodes are in a run that has not "
                "ended; change a net before mujou.run or after its run ended"
            )
        return value

    def _check_open(self, change: str) -> None:
        """Refuse to change this branch while it is in a running net (net.fixed-while-running).

        A run claims every node of its net, and nets nest: this branch is in a running net
        when every node of the nearest branch that holds any (this one or an enclosing one)
        is in that run. Its first node names the run, if any; only then are the others
        looked at, so building a net costs no walk over it.
        """
        branch: Branch | None = self
        while branch is not None:
            first = next(branch.nodes(), None)
            if first is not None:
                engine = _core(first).engine
                if engine is not None and all(_core(node).engine is engine for node in branch.nodes()):
                    where = f"{type(self).__name__} {self.name!r}" if self.name else type(self).__name__
                    raise RuntimeError(
                        f"{where} cannot change ({change}) while its net is in a run that has "
                        "not ended; change a net before mujou.run or after its run ended"
                    )
                return
            branch = branch._parent

    def _place(self, key: str, member: Node | Branch) -> None:
        """Record on ``member`` that it is this branch's member ``key``."""
        if isinstance(member, Node):
            core = _core(member)
            core.parent, core.attr = self, key
        else:
            object.__setattr__(member, "_parent", self)
            object.__setattr__(member, "_attr", key)

    def __str__(self) -> str:
        """The tree of its members, one node a line with its ports below, as ``print(nn.Module)``.

        See :ref:`net.print`; ``repr()`` stays one short line.
        """
        try:
            return branch_text(self, Node)
        except Exception:  # printing must not fail, even while another thread changes the net
            return repr(self)

    def _ancestors(self) -> Iterator[Branch]:
        branch = self._parent
        while branch is not None:
            yield branch
            branch = branch._parent


def check_removable(member: Node | Branch) -> None:
    """Refuse to take ``member`` out of its branch while it holds a node in a run."""
    if _holds_running_node(member):
        raise RuntimeError(
            f"cannot remove {member.name!r}: its nodes are in a run that has not ended; "
            "change a net before mujou.run or after its run ended"
        )


def unplace(member: Node | Branch) -> None:
    """Record on ``member`` that it is in no branch any more."""
    if isinstance(member, Node):
        core = _core(member)
        core.parent, core.attr = None, ""
    else:
        object.__setattr__(member, "_parent", None)
        object.__setattr__(member, "_attr", "")


def _holds_running_node(member: Node | Branch) -> bool:
    """Whether ``member`` is a node in a run, or holds one."""
    if isinstance(member, Node):
        return _core(member).engine is not None
    return any(_core(node).engine is not None for node in member.nodes())


class Net(Branch):
    """A container of nodes and sub-nets, registered by attribute, like ``torch.nn.Module``.

    Assign nodes, nets and node containers (:class:`NodeList`, :class:`NodeDict`) as
    attributes in ``__init__`` after ``super().__init__()``, and connect their ports with
    :meth:`connect`. See :ref:`net.register`.
    """

    _children: dict[str, Node | Branch]
    _kind_name = "Net"

    def __init__(self) -> None:
        object.__setattr__(self, "_children", {})
        self._init_branch()

    def _members(self) -> Iterator[tuple[str, Node | Branch]]:
        yield from self._children.items()

    def __setattr__(self, attr: str, value: object) -> None:
        children = self.__dict__.get("_children")
        if isinstance(value, Node | Branch):
            if children is None:
                raise TypeError(_branch_not_initialized_message(self) + ", before assigning nodes")
            self._check_open(f"register {attr!r}")
            self._check_member(attr, value, type(self).__name__)
            if attr in children:
                self._release(attr)
            children[attr] = value
            self._place(attr, value)
        else:
            if isinstance(value, _PLAIN_COLLECTIONS) and _holds_member(value, set()):
                raise TypeError(_plain_collection_message(self, attr, value))
            if children is not None and attr in children:
                self._check_open(f"replace {attr!r}")
                self._release(attr)
        object.__setattr__(self, attr, value)

    def __delattr__(self, attr: str) -> None:
        if attr in self.__dict__.get("_children", {}):
            self._check_open(f"delete {attr!r}")
            self._release(attr)
        object.__delattr__(self, attr)

    def _release(self, attr: str) -> None:
        member = self._children[attr]
        check_removable(member)
        unplace(member)
        del self._children[attr]

    def connect(self, output: Output[M], input: Input[M]) -> None:
        """Connect ``output`` to ``input``: the input reads the output's latest message.

        An output may feed any number of inputs; an input has at most one source.
        See :ref:`net.connect` and :ref:`net.one-source`.

        Raises:
            TypeError: the arguments are not an output and an input of node instances.
            ValueError: the input already has a source, or the two declare messages that
                cannot match (see :ref:`net.typed-connect`).
            RuntimeError: a node of either port is in a run that has not ended.
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
        for port in (output, input):
            if _core(port.node).engine is not None:
                raise RuntimeError(
                    f"cannot connect {output.name!r} to {input.name!r}: node {port.node.name!r} "
                    "is in a run that has not ended; connect ports before mujou.run or after "
                    "the run ended"
                )
        if input._source is not None:
            raise ValueError(
                f"input {input.name!r} already has the source {input._source.name!r}; "
                "an input has at most one source"
            )
        link(output, input)

    def __repr__(self) -> str:
        """``<Robot net: 2 nodes>``, with the net's name when it is a sub-net; never raises."""
        cls = type(self).__name__
        try:
            if not _branch_initialized(self):
                return f"<{cls} net (not initialized)>"
            name = self.name
            where = f" {name!r}" if name else ""
            return f"<{cls} net{where}: {_count(self)}>"
        except Exception:  # a repr must not fail, even while another thread changes the net
            return f"<{cls} net>"


def _count(branch: Branch) -> str:
    count = sum(1 for _ in branch.nodes())
    return "1 node" if count == 1 else f"{count} nodes"


def _branch_initialized(branch: Branch) -> bool:
    return "_parent" in branch.__dict__


def _branch_not_initialized_message(branch: Branch) -> str:
    cls = type(branch).__name__
    return (
        f"{cls} was not initialized as a mujou.{branch._kind_name}: call super().__init__() at "
        f"the start of {cls}.__init__"
    )


def _kind_of(branch: Branch) -> str:
    return "net" if isinstance(branch, Net) else type(branch).__name__


def _holds_member(value: object, seen: set[int]) -> bool:
    """Whether a plain list, tuple, set or dict holds a node, net or container, at any depth."""
    if isinstance(value, Node | Branch):
        return True
    if not isinstance(value, _PLAIN_COLLECTIONS) or id(value) in seen:
        return False
    seen.add(id(value))
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    return any(_holds_member(item, seen) for item in items)


def _plain_collection_message(net: Net, attr: str, value: object) -> str:
    kind = type(value).__name__
    fix = (
        f"self.{attr} = mujou.NodeDict({{...}})"
        if isinstance(value, dict)
        else f"self.{attr} = mujou.NodeList([...])"
    )
    return (
        f"{type(net).__name__}.{attr} is a {kind} that holds nodes; a net registers nodes held "
        f"in a mujou.NodeList or a mujou.NodeDict, not in a plain {kind}: {fix}"
    )


def path(branch: Parent, key: str) -> str:
    prefix = branch.name
    return f"{prefix}.{key}" if prefix else key


def _kind(value: object) -> str:
    if isinstance(value, Output | Input):
        return f"{type(value).__name__} {value.name!r}"
    return f"{type(value).__name__}: {value!r}"
