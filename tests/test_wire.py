"""A nest's structure in its ring's slot (``_wire.packed_rest``): what goes in comes out, and
the room grows by powers of two, so a structure whose size changes a little keeps its ring."""

from __future__ import annotations

import pytest

from mujou._processes._wire import packed_rest, unpacked_rest

RESTS = [
    None,
    ({"a": 0, "b": "words"}, (0,)),
    ((0, 1.5, None, [0, "x" * 1000]), (0, 3)),  # more than the least room
]


@pytest.mark.parametrize("rest", RESTS, ids=["none", "small", "large"])
def test_a_rest_comes_back_equal(rest: object) -> None:
    leaf = packed_rest(rest, 0)  # type: ignore[arg-type]  # any picklable value
    assert unpacked_rest(leaf.clone()) == rest


def test_the_room_grows_by_powers_of_two_and_never_shrinks() -> None:
    small = packed_rest(({"w": "x"}, (0,)), 0)
    assert small.numel() == 256  # the least room
    assert packed_rest(({"w": "x" * 10}, (0,)), small.numel()).numel() == 256  # fits: the same leaf size
    large = packed_rest(({"w": "x" * 300}, (0,)), small.numel())
    assert large.numel() == 512
    assert packed_rest(({"w": "x"}, (0,)), large.numel()).numel() == 512  # keeps its room
    assert unpacked_rest(large) == ({"w": "x" * 300}, (0,))
