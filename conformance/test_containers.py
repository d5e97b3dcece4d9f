"""Conformance tests for node containers and the net's node iterators (spec/en/nodes-and-ports.md).

Rules ``net.containers``, ``net.container-*``, ``net.plain-collection``, ``net.nodes``,
``net.fixed-while-running`` and ``nodes.repr``: ``NodeList`` and ``NodeDict`` register their
members as ``torch.nn.ModuleList`` and ``nn.ModuleDict`` do.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from _support import Bag, Plain, vt

import mujou
from mujou import Input, Net, Node, NodeDict, NodeList, Output


class Source(Node):
    """Sends a counter that grows by one at each update, drawn noise added."""

    out = Output()

    def __init__(self, seed: int = 0) -> None:
        super().__init__(period=0.25, seed=seed)
        self.value = torch.zeros(())

    def on_update(self, dt: float) -> None:
        self.value += 1 + torch.rand((), generator=self.generator)
        self.out.send(self.value)


class Sink(Node):
    """Keeps the sum of what it reads."""

    x = Input()

    def __init__(self) -> None:
        super().__init__(period=0.5, seed=1)
        self.total = torch.zeros(())

    def on_update(self, dt: float) -> None:
        message = self.x.read()
        if message is not None:
            self.total += message


class Arm(Net):
    def __init__(self) -> None:
        super().__init__()
        self.joint = Source(seed=5)


class Fan(Net):
    """Three sources in a NodeList, two arms in a NodeDict, a sink reading the list's first."""

    def __init__(self) -> None:
        super().__init__()
        self.srcs = NodeList([Source(seed=i) for i in range(3)])
        self.arms = NodeDict({"left": Arm(), "right": Arm()})
        self.sink = Sink()
        self.connect(self.srcs[0].out, self.sink.x)


def names(net: Net | NodeList[Any] | NodeDict[Any]) -> list[str]:
    return [node.name for node in net.nodes()]


# --- net.containers -------------------------------------------------------------------------


@pytest.mark.rule("net.containers")
def test_members_are_registered_by_index_and_key() -> None:
    """> Assigned to an attribute of a Net (or held in another container), a container registers
    > each member under its index ("0", "1", ...) or its key, after the container's own name."""
    fan = Fan()
    assert names(fan) == ["srcs.0", "srcs.1", "srcs.2", "arms.left.joint", "arms.right.joint", "sink"]
    assert fan.srcs.name == "srcs" and fan.arms.name == "arms"
    assert fan.arms["left"].name == "arms.left"
    assert fan.sink.x.source is fan.srcs[0].out
    assert fan.srcs[0].out.name == "srcs.0.out"
    # Containers nest, and hold nets; before registration the names are relative.
    grid = NodeList([NodeList([Plain(), Plain()]), NodeList([Plain()])])
    assert names(grid) == ["0.0", "0.1", "1.0"]
    net = Bag(grid=grid)
    assert names(net) == ["grid.0.0", "grid.0.1", "grid.1.0"]
    assert grid[1][0].name == "grid.1.0"


@pytest.mark.rule("net.containers")
def test_containers_run_and_resume_exactly() -> None:
    """> ... the registration order is the list's order ... ; in the state tree a container is a
    > nested dict, and a run resumed from it goes on bit for bit."""
    with mujou.run(Fan(), timer=vt()) as run:
        run.sleep(1.0)
        tree = run.state_dict()
        run.sleep(1.0)
        went_on = run.state_dict()
    assert sorted(tree) == ["@mujou", "arms", "sink", "srcs"]
    assert sorted(tree["srcs"]) == ["0", "1", "2"]
    assert sorted(tree["arms"]) == ["left", "right"]
    assert sorted(tree["arms"]["left"]["joint"]) == ["generator", "value"]
    assert float(tree["sink"]["total"]) > 0, "the sink read the list's first source"
    # The three sources drew different noise: their states are distinct entries.
    values = [float(tree["srcs"][key]["value"]) for key in "012"]
    assert len(set(values)) == 3, values
    resumed_net = Fan()
    with mujou.run(resumed_net, timer=vt(), state=tree) as run:
        assert run.time == 1.0
        run.sleep(1.0)
        resumed = run.state_dict()
    for key in "012":
        assert torch.equal(resumed["srcs"][key]["value"], went_on["srcs"][key]["value"]), key
        assert torch.equal(resumed["srcs"][key]["generator"], went_on["srcs"][key]["generator"]), key
    for side in ("left", "right"):
        assert torch.equal(resumed["arms"][side]["joint"]["value"], went_on["arms"][side]["joint"]["value"])
    assert torch.equal(resumed["sink"]["total"], went_on["sink"]["total"])


# --- net.container-list ---------------------------------------------------------------------


@pytest.mark.rule("net.container-list")
def test_node_list_reads_as_a_list() -> None:
    """> A NodeList supports len, iteration, in (the same object), [i] (negative from the end; a
    > slice gives a plain list) ..."""
    a, b, c = Plain(), Plain(), Plain()
    srcs = NodeList([a, b, c])
    assert len(srcs) == 3 and list(srcs) == [a, b, c]
    assert a in srcs and Plain() not in srcs
    assert srcs[0] is a and srcs[-1] is c and srcs[-3] is a
    assert srcs[1:] == [b, c] and type(srcs[1:]) is list
    assert srcs.index(b) == 1
    with pytest.raises(ValueError, match=r"is not a member of"):
        srcs.index(Plain())
    with pytest.raises(IndexError, match=r"^NodeList index 3 out of range for 3 member\(s\)$"):
        srcs[3]
    with pytest.raises(IndexError, match=r"^NodeList index -4 out of range"):
        srcs[-4]
    with pytest.raises(TypeError, match=r"^NodeList indices must be integers or slices, got str: 'a'$"):
        srcs["a"]  # type: ignore[call-overload]  # the wrong index is the point


@pytest.mark.rule("net.container-list")
def test_node_list_changes_as_a_list_and_renumbers() -> None:
    """> ... [i] = member, del [i], append, extend, insert, pop and index. An insertion or a
    > deletion renumbers the members after it, and their names follow."""
    a, b, c, d, e = (Plain() for _ in range(5))
    net = Bag(srcs=NodeList([a, b]))
    srcs: NodeList[Plain] = net.srcs  # type: ignore[attr-defined]  # Bag declares no attributes
    srcs.append(c)
    assert [n.name for n in (a, b, c)] == ["srcs.0", "srcs.1", "srcs.2"]
    srcs.insert(0, d)
    assert list(srcs) == [d, a, b, c]
    assert [n.name for n in srcs] == ["srcs.0", "srcs.1", "srcs.2", "srcs.3"]
    assert a.name == "srcs.1"
    del srcs[1]
    assert a.name == "" and list(srcs) == [d, b, c] and c.name == "srcs.2"
    srcs[0] = e
    assert d.name == "" and e.name == "srcs.0" and list(srcs) == [e, b, c]
    assert srcs.pop() is c and c.name == "" and len(srcs) == 2
    srcs.extend([a, d])
    assert names(net) == ["srcs.0", "srcs.1", "srcs.2", "srcs.3"] and list(srcs) == [e, b, a, d]
    srcs.insert(-1, c)  # as list.insert: before the last
    assert list(srcs) == [e, b, a, c, d]
    assert srcs.pop(0) is e and b.name == "srcs.0"
    del srcs[::2]  # b and c
    assert list(srcs) == [a, d] and [a.name, d.name] == ["srcs.0", "srcs.1"]
    assert b.name == c.name == ""
    srcs[0:1] = [b, c]
    assert list(srcs) == [b, c, d] and d.name == "srcs.2" and a.name == ""
    # A member taken out is free to be registered again.
    net.again = a
    assert a.name == "again"


# --- net.container-dict ---------------------------------------------------------------------


@pytest.mark.rule("net.container-dict")
def test_node_dict_works_as_a_dict() -> None:
    """> A NodeDict supports len, iteration over its keys, in (a key), [key], [key] = member (a
    > key already there keeps its place), del [key], keys, values, items, get, pop and update;
    > it is made from a mapping, from (key, member) pairs or from keywords."""
    left, right, up, down, spare = (Plain() for _ in range(5))
    net = Bag(arms=NodeDict({"left": left}, right=right))
    arms: NodeDict[Plain] = net.arms  # type: ignore[attr-defined]  # Bag declares no attributes
    assert list(arms) == ["left", "right"] and len(arms) == 2
    assert "left" in arms and "up" not in arms and left not in arms
    assert arms["left"] is left and arms.get("up") is None and arms.get("up", spare) is spare
    arms.update([("up", up)])
    arms["down"] = down
    assert list(arms.keys()) == ["left", "right", "up", "down"]
    assert list(arms.values()) == [left, right, up, down]
    assert list(arms.items())[2] == ("up", up)
    assert names(net) == ["arms.left", "arms.right", "arms.up", "arms.down"]
    arms["right"] = spare  # replaced in its place
    assert right.name == "" and spare.name == "arms.right"
    assert names(net) == ["arms.left", "arms.right", "arms.up", "arms.down"]
    del arms["left"]
    assert left.name == "" and list(arms) == ["right", "up", "down"]
    assert arms.pop("up") is up and up.name == ""
    with pytest.raises(KeyError):
        arms["left"]
    assert dict(NodeDict([("a", Plain())]).items()).keys() == {"a"}


@pytest.mark.rule("net.container-dict")
def test_node_dict_keys_are_checked() -> None:
    """> A key is a non-empty str without ".": another key raises TypeError (not a str) or
    > ValueError."""
    arms: NodeDict[Plain] = NodeDict()
    with pytest.raises(TypeError, match=r"^NodeDict keys must be str, got int: 1$"):
        arms[1] = Plain()  # type: ignore[index]  # the wrong key is the point
    for key in ("", "left.arm"):
        with pytest.raises(ValueError, match=rf"^NodeDict key {re.escape(repr(key))} is not allowed: "):
            arms[key] = Plain()
    assert len(arms) == 0
    with pytest.raises(TypeError, match=r"^NodeDict takes a mapping or \(key, member\) pairs, got str"):
        NodeDict("left")  # type: ignore[arg-type]  # the wrong argument is the point


# --- net.container-members ------------------------------------------------------------------


class ForgetsSuper(Node):
    def __init__(self) -> None:
        self.value = 1


@pytest.mark.rule("net.container-members")
def test_members_are_checked_and_a_refused_change_changes_nothing() -> None:
    """> a value that is not a node, a net or a container raises TypeError; so does a node whose
    > __init__ did not call super().__init__(); a member registered elsewhere, or given twice,
    > raises ValueError naming both places. A refused change leaves the container as it was."""
    a, b = Plain(), Plain()
    net = Bag(srcs=NodeList([a]), other=b)
    srcs: NodeList[Node] = net.srcs  # type: ignore[attr-defined]  # Bag declares no attributes
    with pytest.raises(
        TypeError, match=r"^a NodeList holds nodes, nets and node containers; 'srcs\.1' got int: 5$"
    ):
        srcs.append(5)  # type: ignore[arg-type]  # the wrong member is the point
    with pytest.raises(TypeError, match=r"^ForgetsSuper was not initialized as a mujou\.Node"):
        srcs.append(ForgetsSuper())
    with pytest.raises(
        ValueError,
        match=r"^Plain is already registered as 'other'; it cannot also be 'srcs\.2': "
        r"a node or net belongs to one net, once$",
    ):
        srcs.extend([Plain(), b])
    fresh = Plain()
    with pytest.raises(ValueError, match=r"^Plain is given as 'srcs\.1' and as 'srcs\.2'"):
        srcs.extend([fresh, fresh])
    with pytest.raises(
        ValueError, match=r"^Plain is already registered as 'srcs\.0'; it cannot also be 'srcs\.1'"
    ):
        srcs.append(a)
    with pytest.raises(ValueError, match=r"cannot contain itself"):
        srcs.append(srcs)  # type: ignore[arg-type]  # the wrong member is the point
    assert list(srcs) == [a] and fresh.name == "" and b.name == "other"
    arms: NodeDict[Node] = NodeDict()
    with pytest.raises(TypeError, match=r"^a NodeDict holds nodes, nets and node containers; 'x' got str"):
        arms["x"] = "node"  # type: ignore[assignment]  # the wrong member is the point
    with pytest.raises(TypeError, match=r"^a NodeList registers its members by index, not as attributes"):
        srcs.extra = Plain()  # the mistake is the point
    assert len(arms) == 0 and list(srcs) == [a]


# --- net.plain-collection -------------------------------------------------------------------


class ListNet(Net):
    def __init__(self, value: object) -> None:
        super().__init__()
        self.srcs = value


@pytest.mark.rule("net.plain-collection")
@pytest.mark.parametrize(
    ("make", "kind", "fix"),
    [
        (lambda: [Plain(), Plain()], "list", "NodeList"),
        (lambda: (Plain(),), "tuple", "NodeList"),
        (lambda: {Plain()}, "set", "NodeList"),
        (lambda: frozenset({Plain()}), "frozenset", "NodeList"),
        (lambda: {"left": Plain()}, "dict", "NodeDict"),
        (lambda: [[1, 2], [Plain()]], "list", "NodeList"),  # at any depth
        (lambda: [Bag()], "list", "NodeList"),  # a net
        (lambda: [NodeList()], "list", "NodeList"),  # a container
    ],
    ids=["list", "tuple", "set", "frozenset", "dict", "nested", "net", "container"],
)
def test_plain_collection_of_nodes_is_refused(make: object, kind: str, fix: str) -> None:
    """> Assigning to an attribute of a Net a list, tuple, set, frozenset or dict that holds a
    > node, a net or a container (at any depth) raises TypeError naming the attribute and
    > pointing at NodeList and NodeDict."""
    assert callable(make)
    with pytest.raises(TypeError) as info:
        ListNet(make())
    message = str(info.value)
    assert message.startswith(f"ListNet.srcs is a {kind} that holds nodes; "), message
    assert "mujou.NodeList or a mujou.NodeDict" in message, message
    assert message.endswith(f"self.srcs = mujou.{fix}(" + ("{...})" if fix == "NodeDict" else "[...])")), (
        message
    )


@pytest.mark.rule("net.plain-collection")
def test_plain_collection_without_nodes_is_an_ordinary_attribute() -> None:
    """> ... that holds a node: other lists are ordinary attributes."""
    net = ListNet([1, "two", torch.zeros(1)])
    assert getattr(net, "srcs")[1] == "two"  # noqa: B009 - the attribute is dynamic
    assert list(net.nodes()) == []


# --- net.nodes ------------------------------------------------------------------------------


@pytest.mark.rule("net.nodes")
def test_nodes_and_named_nodes() -> None:
    """> net.nodes() and net.named_nodes() iterate over every node of the net, of its sub-nets
    > and of its node containers, depth first, in registration order; named_nodes() yields
    > (name, node) pairs whose names are relative to the net. Sub-nets and containers are not
    > yielded themselves."""
    fan = Fan()
    nodes = list(fan.nodes())
    assert all(isinstance(node, Node) for node in nodes)
    assert nodes == [*fan.srcs, fan.arms["left"].joint, fan.arms["right"].joint, fan.sink]
    assert [(name, node) for name, node in fan.named_nodes()] == [(node.name, node) for node in nodes]
    assert [name for name, _ in fan.arms.named_nodes()] == ["left.joint", "right.joint"]
    assert [name for name, _ in fan.arms["left"].named_nodes()] == ["joint"]
    assert [name for name, _ in fan.srcs.named_nodes()] == ["0", "1", "2"]
    assert list(Bag().named_nodes()) == []


# --- net.fixed-while-running ----------------------------------------------------------------

WHILE_RUNNING = r"cannot change \((?P<change>.*)\) while its net is in a run that has not ended; "


@pytest.mark.rule("net.fixed-while-running")
def test_net_and_containers_do_not_change_while_running() -> None:
    """> While a run of a net has not ended, that net and the nets and containers in it do not
    > change: registering, replacing or removing a node, a sub-net or a container (by attribute
    > or in a container), and connect of a port of a node in the run, raise RuntimeError."""
    fan = Fan()
    spare = Source()
    with mujou.run(fan, timer=vt()) as run:
        run.sleep(0.5)
        with pytest.raises(RuntimeError, match=r"^NodeList 'srcs' " + WHILE_RUNNING):
            fan.srcs.append(spare)
        with pytest.raises(RuntimeError, match=r"^NodeList 'srcs' " + WHILE_RUNNING):
            del fan.srcs[0]
        with pytest.raises(RuntimeError, match=r"^NodeDict 'arms' " + WHILE_RUNNING):
            fan.arms["up"] = Arm()
        with pytest.raises(RuntimeError, match=r"^Arm 'arms\.left' " + WHILE_RUNNING):
            fan.arms["left"].hand = spare
        with pytest.raises(RuntimeError, match=r"^Fan " + WHILE_RUNNING):
            fan.extra = spare
        with pytest.raises(RuntimeError, match=r"^Fan " + WHILE_RUNNING):
            del fan.sink
        with pytest.raises(RuntimeError, match=r"^Fan " + WHILE_RUNNING):
            fan.sink = None  # type: ignore[assignment]  # replacing a node is the point
        with pytest.raises(RuntimeError, match=r"^cannot connect 'srcs\.1\.out' to 'sink\.x': node "):
            fan.connect(fan.srcs[1].out, fan.sink.x)
        fan.note = "a plain attribute may change"
        run.sleep(0.5)
        assert names(fan) == ["srcs.0", "srcs.1", "srcs.2", "arms.left.joint", "arms.right.joint", "sink"]
        assert spare.name == ""
    # Once the run has ended, the net may change again.
    fan.srcs.append(spare)
    del fan.arms["right"]
    assert spare.name == "srcs.3" and "right" not in fan.arms


@pytest.mark.rule("net.fixed-while-running")
def test_a_net_outside_the_run_may_change() -> None:
    """> While a run of a net has not ended, that net ... do not change: another net does."""
    running, other = Fan(), Fan()
    with mujou.run(running, timer=vt()) as run:
        other.srcs.append(Source())
        extra = Sink()
        other.extra = extra
        other.connect(other.srcs[3].out, extra.x)
        del other.arms["left"]
        run.sleep(0.25)
    assert names(other) == ["srcs.0", "srcs.1", "srcs.2", "srcs.3", "arms.right.joint", "sink", "extra"]
    # A sub-net run on its own: the enclosing net and its other containers may change.
    sub = Fan()
    outer = Bag(first=sub, spare=NodeList(), last=Plain())
    with mujou.run(sub, timer=vt()) as run:
        outer.spare.append(Plain())  # type: ignore[attr-defined]  # Bag declares no attributes
        outer.more = Plain()
        with pytest.raises(RuntimeError, match=r"^Fan 'first' " + WHILE_RUNNING):
            sub.extra = Plain()
        with pytest.raises(RuntimeError, match=r"^cannot remove 'first': its nodes are in a run"):
            del outer.first  # type: ignore[attr-defined]  # Bag declares no attributes
        run.sleep(0.25)
    assert names(outer)[-3:] == ["spare.0", "last", "more"]


# --- nodes.repr -----------------------------------------------------------------------------


@pytest.mark.rule("nodes.repr")
def test_reprs_of_nodes_nets_and_containers() -> None:
    """> repr() of a node shows its class, name, period and device; of a net its class, name and
    > number of nodes; of a container its kind, name and members; it never raises."""
    fan = Fan()
    assert repr(fan) == "<Fan net: 6 nodes>"
    assert repr(fan.arms["left"]) == "<Arm net 'arms.left': 1 node>"
    assert repr(fan.srcs[1]) == "<Source 'srcs.1' period=0.25 cpu>"
    assert repr(Source()) == "<Source (in no net) period=0.25 cpu>"
    assert (
        repr(Plain(period=0.5, dedicated_thread=True))
        == "<Plain (in no net) period=0.5 cpu dedicated_thread>"
    )
    assert repr(fan.srcs) == "<NodeList 'srcs': 3 members>"
    assert repr(NodeList([Plain()])) == "<NodeList: 1 member>"
    assert repr(fan.arms) == "<NodeDict 'arms': 'left', 'right'>"
    assert repr(NodeDict()) == "<NodeDict: empty>"
    many = NodeDict({f"k{i}": Plain() for i in range(8)})
    assert repr(many) == "<NodeDict: 'k0', 'k1', 'k2', 'k3', 'k4', 'k5', ... (8 members)>"
    assert repr(ForgetsSuper()) == "<ForgetsSuper (not initialized: no super().__init__())>"

    class NoSuperNet(Net):
        def __init__(self) -> None:
            pass

    assert repr(NoSuperNet()) == "<NoSuperNet net (not initialized)>"
