"""The pickling of commands, replies and events between the processes of a run (_codec)."""

from __future__ import annotations

import pickle
import threading

import pytest
import torch

from mujou._processes._codec import dumps, loads

TENSORS = [
    torch.arange(5.0),  # 1-d: no view on the way back
    torch.tensor(2.5),  # 0-d
    torch.arange(6.0).reshape(2, 3),
    torch.arange(6).reshape(2, 3).t(),  # not contiguous
    torch.arange(10)[2:7:2],  # a strided view with an offset
    torch.zeros(0, 3),
    torch.tensor(True),
    torch.ones(3, dtype=torch.bfloat16),
    torch.randn(2, dtype=torch.complex64),
    torch.randn(2, dtype=torch.complex64).conj(),  # a lazy conjugate: torch's own reduction
    torch.ones(2, requires_grad=True),  # torch's own reduction keeps requires_grad
    torch.nn.Parameter(torch.ones(2)),  # a subclass: torch's own reduction
]


@pytest.mark.parametrize("tensor", TENSORS, ids=lambda t: f"{t.dtype}{tuple(t.shape)}")
def test_a_tensor_comes_back_equal(tensor: torch.Tensor) -> None:
    back = loads(dumps({"t": tensor, "n": 3}))
    assert back["n"] == 3
    out = back["t"]
    assert type(out) is type(tensor)
    assert (out.dtype, out.shape, out.requires_grad) == (tensor.dtype, tensor.shape, tensor.requires_grad)
    assert torch.equal(out.detach().resolve_conj(), tensor.detach().resolve_conj())


def test_the_copy_shares_no_memory() -> None:
    tensor = torch.zeros(4)
    back = loads(dumps(tensor))
    back += 1
    assert torch.equal(tensor, torch.zeros(4))
    back2 = loads(dumps(tensor))
    assert back2.data_ptr() != back.data_ptr()


def test_a_plain_tensor_is_sent_as_bytes() -> None:
    """The fast path is taken: no torch.save machinery in the pickle (planted: return
    NotImplemented always, and this fails)."""
    data = dumps(torch.arange(4))
    assert b"torch._utils" not in data and b"_rebuild_tensor" not in data
    assert b"torch._utils" in pickle.dumps(torch.arange(4))


def test_a_dump_that_fails_leaves_nothing_behind() -> None:
    """Each thread reuses its pickler and buffer: a dump that raised must not leave its bytes
    for the next (planted: the buffer kept, and the next load fails)."""
    with pytest.raises((TypeError, pickle.PicklingError, AttributeError)):
        dumps({"ok": torch.ones(2), "bad": lambda: None})
    back = loads(dumps({"t": torch.arange(3)}))
    assert torch.equal(back["t"], torch.arange(3))


def test_threads_dump_at_once() -> None:
    """Commands, replies and events are pickled on several threads at once (planted: one
    pickler shared by every thread, and the pickles mix)."""
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def dump_many(k: int) -> None:
        start.wait(timeout=30)
        try:
            for i in range(2000):
                tensor = torch.full((k + 1,), float(i))
                value = {"k": k, "i": i, "t": tensor}
                back = loads(dumps(value))
                assert back["k"] == k and back["i"] == i and torch.equal(back["t"], tensor)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=dump_many, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive()
    assert not errors, errors[0]
