"""The pickling of commands, replies and events between the processes of a run (_codec)."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
import threading
from typing import Any, SupportsIndex

import pytest
import torch

from mujou._processes._codec import _rebuilt, dumps, loads

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


def test_the_rebuild_goes_by_its_extension_code_not_by_name() -> None:
    """``_rebuilt`` is pickled as copyreg's extension code, which a load finds without an
    import; a scalar comes back 0-d and contiguous. Planted: no ``add_extension``: this fails."""
    data = dumps(torch.tensor(3))
    assert b"_rebuilt" not in data and b"_codec" not in data
    back = loads(data)
    assert (back.shape, back.stride(), int(back)) == ((), (), 3)


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


def test_a_quantized_tensor_keeps_its_quantizer() -> None:
    """Issue 23 #9: a quantized tensor is not sent as its bytes (its scale and zero point would
    stay behind, and dequantize() then crashes). Run in a subprocess, so that a crash fails
    this test instead of ending pytest (planted: no dtype check in the fast path, and the
    subprocess dies with SIGSEGV or prints a wrong value)."""
    script = (
        "import torch\n"
        "from mujou._processes._codec import _rebuilt, dumps, loads\n"
        "q = torch.quantize_per_tensor(torch.tensor([1.0, 2.0, 3.0]), 0.5, 3, torch.quint8)\n"
        "back = loads(dumps({'w': q}))['w']\n"
        "print(back.is_quantized, back.q_scale(), back.q_zero_point(), back.dequantize().tolist())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.split() == ["True", "0.5", "3", "[1.0,", "2.0,", "3.0]"]


@pytest.mark.parametrize(
    ("dtype", "shape", "data", "match"),
    [
        ("torch.float32", (3,), b"\0" * 8, "8 bytes for shape"),  # too short
        ("torch.float32", (1,), b"\0" * 8, "8 bytes for shape"),  # too long
        ("torch.quint8", (3,), b"\0" * 3, "dtype 'torch.quint8'"),  # not a plain dtype
        ("os.system", (1,), b"\0", "dtype 'os.system'"),
        ("torch.int8", (-1,), b"", "shape"),
    ],
)
def test_a_malformed_frame_is_an_error(dtype: str, shape: tuple[int, ...], data: bytes, match: str) -> None:
    """The rebuild checks what the frame says (planted: no length check, and a short frame
    makes a tensor over memory it does not own, or a wrong shape)."""
    frame = dumps(_Call(dtype, shape, data))  # a frame made by hand, as a corrupted one would be
    with pytest.raises(ValueError, match=rf"^malformed tensor in a frame: .*{re.escape(match)}"):
        loads(frame)


class _Call:
    """Pickles as a call of the codec's rebuild with the given (maybe malformed) arguments."""

    def __init__(self, dtype: str, shape: tuple[int, ...], data: bytes) -> None:
        self.args = dtype, shape, data

    def __reduce__(self) -> tuple[object, tuple[str, tuple[int, ...], bytes]]:
        return _rebuilt, self.args


class _Registered:
    """Pickled through a reduction in copyreg's table only (it refuses the default)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __reduce_ex__(self, protocol: SupportsIndex) -> str | tuple[Any, ...]:
        raise TypeError("only copyreg's reduction pickles this")


def _rebuild_registered(value: int) -> _Registered:
    return _Registered(value)


def test_copyregs_table_as_it_is_at_each_dump() -> None:
    """The pickler's table adds the tensor's reduction to copyreg's, looked up at each dump: a
    reduction registered after the import still counts (planted: the table a copy of
    copyreg's at the import, and the dump raises)."""
    import copyreg

    copyreg.pickle(_Registered, lambda obj: (_rebuild_registered, (obj.value,)))
    try:
        back = loads(dumps({"r": _Registered(7), "t": torch.tensor(2)}))
    finally:
        del copyreg.dispatch_table[_Registered]
    assert back["r"].value == 7 and int(back["t"]) == 2
