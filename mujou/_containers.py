"""``NodeList`` and ``NodeDict``: nodes held by index or key, registered as attributes are.

Like ``torch.nn.ModuleList`` and ``nn.ModuleDict``: assigned to an attribute of a net, a
container registers its members under their index or key, so ``self.srcs = NodeList([a, b])``
names them ``srcs.0`` and ``srcs.1``, and the state tree holds them as ``tree["srcs"]["0"]``.
See :ref:`net.containers`.
"""

from __future__ import annotations

import operator
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, Sequence, ValuesView
from typing import Generic, SupportsIndex, TypeVar, cast, overload

from ._net import Branch, check_removable, path, unplace
from ._node import Node

M = TypeVar("M", bound=Node | Branch)
_SHOWN_KEYS = 6  # a NodeDict's repr names at most this many keys


class NodeList(Branch, Generic[M]):
    """A list of nodes registered by index in the net that holds it, like ``nn.ModuleList``.

    ``self.srcs = NodeList([Src(), Src()])`` in a net's ``__init__`` names the nodes
    ``srcs.0`` and ``srcs.1``. Its members are nodes, nets and node containers; it changes
    as a list does until its net runs, and an insertion or a deletion renumbers the members
    after it. See :ref:`net.containers`.

    Args:
        members: The first members, in order.

    Raises:
        TypeError: a member is not a node, a net or a node container.
        ValueError: a member is registered elsewhere already, or given twice.
    """

    _items: list[M]
    _kind_name = "NodeList"

    def __init__(self, members: Iterable[M] = ()) -> None:
        self._init_branch()
        object.__setattr__(self, "_items", [])
        self.extend(members)

    def _members(self) -> Iterator[tuple[str, M]]:
        for index, member in enumerate(self._items):
            yield str(index), member

    def _splice(self, start: int, stop: int, new: Sequence[object], change: str) -> None:
        """Replace the members ``[start:stop]`` by ``new``: every change of the list is one.

        Everything is checked first, so a refused change leaves the list as it was.
        """
        self._check_open(change)
        items = self._items
        checked: list[M] = []
        places: dict[int, str] = {}
        for offset, value in enumerate(new):
            key = str(start + offset)
            member = self._check_member(key, value, "a NodeList")
            if id(member) in places:
                raise ValueError(
                    f"{type(member).__name__} is given as {path(self, places[id(member)])!r} and "
                    f"as {path(self, key)!r}: a node or net belongs to one net, once"
                )
            places[id(member)] = key
            # The member's class cannot be checked against M at run time; it is a member.
            checked.append(cast("M", member))
        removed = items[start:stop]
        for member in removed:
            check_removable(member)
        for member in removed:
            unplace(member)
        items[start:stop] = checked
        end = start + len(checked) if len(checked) == len(removed) else len(items)
        for index in range(start, end):
            self._place(str(index), items[index])

    def _position(self, index: SupportsIndex) -> int:
        """``index`` as a position in the list, negative ones counted from the end."""
        try:
            position = operator.index(index)
        except TypeError:
            raise TypeError(
                f"NodeList indices must be integers or slices, got {type(index).__name__}: {index!r}"
            ) from None
        size = len(self._items)
        if not -size <= position < size:
            raise IndexError(f"NodeList index {position} out of range for {size} member(s)")
        return position % size

    def _span(self, index: slice) -> tuple[int, int]:
        start, stop, step = index.indices(len(self._items))
        if step != 1:
            raise ValueError(f"NodeList slices must be contiguous (step 1), got step {step}")
        return start, max(start, stop)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[M]:
        return iter(self._items)

    def __contains__(self, value: object) -> bool:
        """Whether ``value`` is a member (the same object)."""
        return any(member is value for member in self._items)

    @overload
    def __getitem__(self, index: int) -> M: ...

    @overload
    def __getitem__(self, index: slice) -> list[M]: ...

    def __getitem__(self, index: int | slice) -> M | list[M]:
        """The member at ``index``, or a plain list of the members of a slice."""
        if isinstance(index, slice):
            return self._items[index]
        return self._items[self._position(index)]

    @overload
    def __setitem__(self, index: int, value: M) -> None: ...

    @overload
    def __setitem__(self, index: slice, value: Iterable[M]) -> None: ...

    def __setitem__(self, index: int | slice, value: M | Iterable[M]) -> None:
        """Replace the member at ``index`` (or the members of a contiguous slice)."""
        if isinstance(index, slice):
            start, stop = self._span(index)
            new = _listed(value, "a NodeList slice assignment")
            self._splice(start, stop, new, f"replace [{start}:{stop}]")
        else:
            position = self._position(index)
            self._splice(position, position + 1, [value], f"replace {position}")

    def __delitem__(self, index: int | slice) -> None:
        """Remove the member at ``index`` (or those of a slice); later members are renumbered."""
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self._items))
            if step == 1:
                self._splice(start, max(start, stop), [], f"delete [{start}:{stop}]")
            else:
                for position in sorted(range(start, stop, step), reverse=True):
                    self._splice(position, position + 1, [], f"delete {position}")
        else:
            position = self._position(index)
            self._splice(position, position + 1, [], f"delete {position}")

    def append(self, member: M) -> None:
        """Add ``member`` at the end, as ``str(len(self))``."""
        size = len(self._items)
        self._splice(size, size, [member], "append")

    def extend(self, members: Iterable[M]) -> None:
        """Add each of ``members`` at the end, in order."""
        size = len(self._items)
        self._splice(size, size, _listed(members, "NodeList.extend"), "extend")

    def insert(self, index: int, member: M) -> None:
        """Add ``member`` before ``index`` (as ``list.insert``); later members are renumbered."""
        try:
            position = operator.index(index)
        except TypeError:
            raise TypeError(
                f"NodeList.insert takes an int index, got {type(index).__name__}: {index!r}"
            ) from None
        size = len(self._items)
        position = min(max(position + size if position < 0 else position, 0), size)
        self._splice(position, position, [member], "insert")

    def pop(self, index: int = -1) -> M:
        """Remove and return the member at ``index`` (the last by default)."""
        position = self._position(index)
        member = self._items[position]
        self._splice(position, position + 1, [], f"pop {position}")
        return member

    def index(self, member: object) -> int:
        """The position of ``member`` (the same object); ValueError when it is not a member."""
        for position, item in enumerate(self._items):
            if item is member:
                return position
        raise ValueError(f"{member!r} is not a member of {self!r}")

    def __setattr__(self, attr: str, value: object) -> None:
        if isinstance(value, Node | Branch):
            raise TypeError(
                f"a NodeList registers its members by index, not as attributes: use "
                f".append(member) instead of .{attr} = member"
            )
        object.__setattr__(self, attr, value)

    def __repr__(self) -> str:
        """``<NodeList 'srcs': 2 members>``; never raises."""
        try:
            if "_items" not in self.__dict__:
                return "<NodeList (not initialized)>"
            count = len(self._items)
            return f"<NodeList{_where(self)}: {count} member{'' if count == 1 else 's'}>"
        except Exception:  # a repr must not fail, even while another thread changes the list
            return "<NodeList>"


class NodeDict(Branch, Generic[M]):
    """A dict of nodes registered by key in the net that holds it, like ``nn.ModuleDict``.

    ``self.arms = NodeDict({"left": Arm(), "right": Arm()})`` in a net's ``__init__`` names
    the arms ``arms.left`` and ``arms.right``, in insertion order. Keys are non-empty strings
    without ``"."``; members are nodes, nets and node containers. It changes as a dict does
    until its net runs. See :ref:`net.containers`.

    Args:
        members: The first members: a mapping, or ``(key, member)`` pairs.
        **named: More first members, by keyword.

    Raises:
        TypeError: a key is not a str, or a member is not a node, a net or a node container.
        ValueError: a key is empty or holds ``"."``, or a member is registered elsewhere already.
    """

    _items: dict[str, M]
    _kind_name = "NodeDict"

    def __init__(self, members: Mapping[str, M] | Iterable[tuple[str, M]] = (), **named: M) -> None:
        self._init_branch()
        object.__setattr__(self, "_items", {})
        self.update(members)
        self.update(named)

    def _members(self) -> Iterator[tuple[str, M]]:
        yield from self._items.items()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __getitem__(self, key: str) -> M:
        return self._items[key]

    def __setitem__(self, key: str, member: M) -> None:
        """Register ``member`` under ``key``; a key already there keeps its place in the order."""
        _check_key(key)
        self._check_open(f"register {key!r}")
        self._check_member(key, member, "a NodeDict")
        old = self._items.get(key)
        if old is not None:
            check_removable(old)
            unplace(old)
        self._items[key] = member
        self._place(key, member)

    def __delitem__(self, key: str) -> None:
        member = self._items[key]
        self._check_open(f"delete {key!r}")
        check_removable(member)
        unplace(member)
        del self._items[key]

    def keys(self) -> KeysView[str]:
        """The keys, in insertion order."""
        return self._items.keys()

    def values(self) -> ValuesView[M]:
        """The members, in insertion order."""
        return self._items.values()

    def items(self) -> ItemsView[str, M]:
        """``(key, member)`` pairs, in insertion order."""
        return self._items.items()

    def get(self, key: str, default: M | None = None) -> M | None:
        """The member under ``key``, or ``default``."""
        return self._items.get(key, default)

    def pop(self, key: str) -> M:
        """Remove and return the member under ``key``; KeyError when there is none."""
        member = self._items[key]
        del self[key]
        return member

    def update(self, members: Mapping[str, M] | Iterable[tuple[str, M]]) -> None:
        """Register each member of a mapping or of ``(key, member)`` pairs, in order."""
        pairs: object = members.items() if isinstance(members, Mapping) else members
        if isinstance(pairs, str | Node) or not isinstance(pairs, Iterable):
            raise TypeError(
                f"NodeDict takes a mapping or (key, member) pairs, got {type(members).__name__}: {members!r}"
            )
        for pair in list(pairs):
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise TypeError(f"NodeDict takes (key, member) pairs, got {type(pair).__name__}: {pair!r}")
            self[pair[0]] = pair[1]

    def __setattr__(self, attr: str, value: object) -> None:
        if isinstance(value, Node | Branch):
            raise TypeError(
                f"a NodeDict registers its members by key, not as attributes: use "
                f"[{attr!r}] = member instead of .{attr} = member"
            )
        object.__setattr__(self, attr, value)

    def __repr__(self) -> str:
        """``<NodeDict 'arms': 'left', 'right'>``; never raises."""
        try:
            if "_items" not in self.__dict__:
                return "<NodeDict (not initialized)>"
            keys = list(self._items)
            if not keys:
                return f"<NodeDict{_where(self)}: empty>"
            shown = ", ".join(repr(key) for key in keys[:_SHOWN_KEYS])
            more = f", ... ({len(keys)} members)" if len(keys) > _SHOWN_KEYS else ""
            return f"<NodeDict{_where(self)}: {shown}{more}>"
        except Exception:  # a repr must not fail, even while another thread changes the dict
            return "<NodeDict>"


def _check_key(key: object) -> None:
    if not isinstance(key, str):
        raise TypeError(f"NodeDict keys must be str, got {type(key).__name__}: {key!r}")
    if not key or "." in key:
        raise ValueError(
            f"NodeDict key {key!r} is not allowed: a key is a non-empty str without '.', as it "
            "becomes a part of node names (arms.left)"
        )


def _listed(members: object, what: str) -> list[object]:
    if isinstance(members, str | Node) or not isinstance(members, Iterable):
        raise TypeError(f"{what} takes an iterable of members, got {type(members).__name__}: {members!r}")
    return list(members)


def _where(branch: Branch) -> str:
    name = branch.name
    return f" {name!r}" if name else ""
