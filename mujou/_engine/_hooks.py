"""Where hooks are called: in the node's context, with the checks around each call.

``Hooks.call`` calls every hook but one kind: the jobs (on_start, on_stop, state_dict,
load_state_dict), a dedicated thread's updates and a worker's updates of a node on CUDA or
while a trace or a profiler records; a worker's update of a plain CPU node is called in
``_update.batch_runner``, with the same checks (NOTE [ the cost of an update ]).

Around every hook: the node's CUDA device and streams (inside the ``try``, so a CUDA error is
the hook's), a ``torch.profiler`` range while a profiler runs, the time spent (``busy``), a
trace slice, the check that the messages it read were not changed in place, and the
warnings about per-thread settings it left changed or a reseeded global generator. The
warnings wait in a queue for the host (rules.warnings-on-host).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Protocol

import torch

from .._errors import GlobalRandomWarning, LeakedSettingWarning
from .._in_run import HookThread
from .._trace import Recorder
from ._slot import Slot

# Bound once: they run around every hook.
_get_ident = threading.get_ident
_perf_counter = time.perf_counter
_current_thread = threading.current_thread
_is_grad_enabled = torch.is_grad_enabled
_is_inference_mode_enabled = torch.is_inference_mode_enabled
_initial_seed = torch.default_generator.initial_seed


class ProfilerFlag(Protocol):
    """Where the flag that a ``torch.profiler`` runs is read."""

    @property
    def _is_profiler_enabled(self) -> bool: ...


class _NoProfilerFlag:
    _is_profiler_enabled = False


# torch.autograd.profiler's own flag, set by any thread's profiler (the C++ check is per
# thread), or a stand-in that is always False where a torch has none. Read as an attribute
# for every update: ``vars(module).get(name, False)`` cost 700 instructions an update more
# (callgrind, bench's dispatch-virtual: 11.43k -> 10.71k an update).
profiler: ProfilerFlag = (
    torch.autograd.profiler if hasattr(torch.autograd.profiler, "_is_profiler_enabled") else _NoProfilerFlag()
)


class Hooks:
    """Calls the hooks of a run's nodes and keeps the warnings they cause for the host."""

    __slots__ = ("_slots", "_warnings", "seen_seed", "trace")

    def __init__(self, slots: Sequence[Slot], trace: Recorder | None) -> None:
        self._slots = slots
        self.trace = trace
        self.seen_seed = torch.initial_seed()
        self._warnings: deque[tuple[type[Warning], str]] = deque()
        for slot in slots:
            slot.core.hooks = self  # where a hook of the node queues a warning for the host

    def call(
        self, slot: Slot, hook: str, fn: Callable[..., Any], *args: Any
    ) -> tuple[Any, BaseException | None]:
        """Call ``fn(*args)``, hook ``hook`` of ``slot``'s node; return (result, exception).

        This runs for every update: keep it to the checks the spec asks for.
        """
        core = slot.core
        slot.hook = hook
        core.hook_thread = _get_ident()
        streams = core.streams
        restore_host: Callable[[], None] | None = None
        grad = _is_grad_enabled()
        inference = _is_inference_mode_enabled()
        if _initial_seed() != self.seen_seed:
            self.observe_seed(None)
        began = _perf_counter()
        try:
            if streams is not None:
                # On the host's thread (state_dict once the run has ended, an update it runs
                # while it waits), put its own device and streams back afterwards: the host's
                # later work is not the node's.
                restore_host = streams.make_current(keep=not isinstance(_current_thread(), HookThread))
                if hook == "state_dict":
                    streams.wait()  # cuda.wait-state-dict: before, and after below
            if profiler._is_profiler_enabled:
                with torch.profiler.record_function(f"{slot.name}.{hook}"):
                    result = core.context.run(fn, *args)
            else:
                result = core.context.run(fn, *args)
            if slot.inputs or core.reads:
                check_reads(slot, hook)
            if streams is not None:
                streams.wait()  # cuda.wait-after-update (and after a restore, and state_dict)
            return result, None
        except BaseException as exc:
            return None, exc
        finally:
            ended = _perf_counter()
            slot.busy_seconds += ended - began
            core.hook_thread = 0
            if slot.inputs or core.reads:
                forget_reads(slot)
            try:
                if restore_host is not None:
                    restore_host()
                if self.trace is not None:
                    if hook == "on_update":
                        slot.traced_at = (_current_thread().name, began + (ended - began) / 2)
                        self.trace.record(slot.name, hook, began, ended, slot.now)
                    else:
                        self.trace.record(slot.name, hook, began, ended, None)
            finally:
                if (
                    _is_grad_enabled() != grad
                    or _is_inference_mode_enabled() != inference
                    or _initial_seed() != self.seen_seed
                ):
                    self.check_settings(slot, hook, grad, inference)

    def check_settings(self, slot: Slot, hook: str, grad: bool, inference: bool) -> None:
        """After a hook: warn of the per-thread settings it changed, and notice a new seed."""
        if _is_grad_enabled() != grad:
            self._warn_setting(slot, hook, "grad mode", "torch.no_grad()")
        if _is_inference_mode_enabled() != inference:
            self._warn_setting(slot, hook, "inference mode", "torch.inference_mode()")
        if _initial_seed() != self.seen_seed:
            self.observe_seed((slot, hook))

    def observe_seed(self, ended: tuple[Slot, str] | None) -> None:
        """Notice a change of torch's global seed, and name the hooks that may have made it.

        Called at the start of each hook (``ended`` None) and at its end. A change is pinned
        on the hook that ends, naming the hooks that ran meanwhile, which may have made it
        instead; a change first seen at a start while no hook runs was the host's.
        """
        seed = torch.initial_seed()
        if seed == self.seen_seed:
            return
        self.seen_seed = seed
        suspects = [] if ended is None else [ended]
        suspects += [(other, other.hook) for other in self.in_hooks()]  # ended has left
        if not suspects:
            return
        (slot, hook), others = suspects[0], [entry[0].name for entry in suspects[1:]]
        if "seed" in slot.warned:
            return
        slot.warned.add("seed")
        also = f" (or node {', '.join(map(repr, others))}, whose hook ran meanwhile)" if others else ""
        self._warnings.append(
            (
                GlobalRandomWarning,
                f"node {slot.name!r}{also} called torch.manual_seed in {hook}: that reseeds the "
                "generator every node shares; draw from self.generator instead "
                "(seeded with Node(seed=...))",
            )
        )

    def _warn_setting(self, slot: Slot, hook: str, setting: str, fix: str) -> None:
        if setting in slot.warned:
            return
        slot.warned.add(setting)
        self._warnings.append(
            (
                LeakedSettingWarning,
                f"node {slot.name!r} returned from {hook} with {setting} changed; the next node on "
                "this thread inherits it: keep such settings inside a with block in the hook "
                f"(with {fix}: ...)",
            )
        )

    def flush_warnings(self, stacklevel: int) -> None:
        """Issue the warnings hooks caused, on the calling (host) thread, each once.

        See rules.warnings-on-host. Safe from several host threads: ``popleft`` is atomic.
        """
        if not self._warnings:  # the common case, without raising IndexError
            return
        while True:
            try:
                category, message = self._warnings.popleft()
            except IndexError:
                return
            warnings.warn(message, category, stacklevel=stacklevel + 1)

    def queue_warning(self, category: type[Warning], message: str) -> None:
        """Keep a warning for the host's next call (rules.warnings-on-host); from any thread."""
        self._warnings.append((category, message))

    def in_hooks(self) -> list[Slot]:
        """The nodes running a hook now (a scan: for the rare paths that name them)."""
        return [slot for slot in self._slots if slot.core.hook_thread]

    def hook_of_this_thread(self) -> str:
        """ " of node 'NAME' (HOOK)" for the hook the calling thread runs, else ""."""
        thread = threading.get_ident()
        slot = next((slot for slot in self.in_hooks() if slot.core.hook_thread == thread), None)
        return "" if slot is None else f" of node {slot.name!r} ({slot.hook})"


def check_reads(slot: Slot, hook: str) -> None:
    """RuntimeError when hook ``hook`` of ``slot``'s node changed a message it read in place
    (ports.message-read-only): the first message read from each input, then the others."""
    for port in slot.inputs:
        read = port._read
        if read is not None and read[0]._version != read[1]:
            changed_read(slot, hook, port)
    for owner, message, version in slot.core.reads:
        if message._version != version:
            changed_read(slot, hook, owner)


def forget_reads(slot: Slot) -> None:
    """The hook returned: forget what it read (after ``check_reads``)."""
    for port in slot.inputs:
        port._read = None
    reads = slot.core.reads
    if reads:
        reads.clear()


def changed_read(slot: Slot, hook: str, port: Any) -> NoReturn:
    """Hook ``hook`` of ``slot``'s node changed in place a message it read from ``port``."""
    raise RuntimeError(
        f"node {slot.name!r} changed in place, in {hook}, a message it read from "
        f"{port.name!r}; messages are shared with the other readers and read-only: "
        "clone it first (message.clone())"
    )
