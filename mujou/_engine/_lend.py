"""The host's thread runs due updates while it waits (NOTE [ the host lends its thread ]).

Guarantees:
- Only inside a host call that waits under the real-time timer (``Engine.wait_real``, used by
  ``run.wait_for``, ``run.sleep``, ``run.join``; ``Subscription.get``), one update at a time,
  taken from the policy as a worker takes it (``Workers.take_for_host``): earliest due first,
  and the node held meanwhile, so its hooks stay exclusive (threads.hooks-exclusive). No job
  (``on_start``, ``on_stop``, ``state_dict``, ``load_state_dict``) and no dedicated node's hook.
- The update runs through the workers' own runner (``_threads.batch_runner``), so in the
  node's context, with its generator, streams and checks, as on a worker. While it runs the
  thread counts as a hook thread (``in_hook_thread``: the host's calls that wait refuse it).
- Per-thread torch settings (threads.host-thread-settings): the thread lends itself only
  while its own are a new thread's (grad mode on, inference mode off, no autocast, no torch
  function or dispatch mode), which a hook sees on a worker no hook changed; afterwards
  grad mode and autocast are put back to those.
- A KeyboardInterrupt that reaches the thread in the hook ends that update and propagates to
  the host (threads.host-interrupt). Any other exception in Mujou's code here stops the run
  with ``MujouInternalError``, which the host's call raises (run.internal-error).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from . import _host_hooks
from ._batches import HOST, Batch
from ._hooks import in_hook_thread
from ._threads import batch_runner

if TYPE_CHECKING:
    from ._lifecycle import Engine

_get_ident = threading.get_ident
_is_grad_enabled = torch.is_grad_enabled
_is_inference_mode_enabled = torch.is_inference_mode_enabled
_is_any_autocast_enabled = torch._C._is_any_autocast_enabled
_function_modes = torch._C._len_torch_function_stack
_dispatch_modes = torch._C._len_torch_dispatch_stack


def fresh_settings() -> bool:
    """Whether the calling thread's per-thread torch settings are those of a new thread."""
    return (
        _is_grad_enabled()
        and not _is_inference_mode_enabled()
        and not _is_any_autocast_enabled()
        and not _function_modes()
        and not _dispatch_modes()
    )


def _put_settings_back() -> None:
    """After a hook that left grad mode or autocast changed: a new thread's again."""
    if not _is_grad_enabled():
        torch.set_grad_enabled(True)
    if _is_any_autocast_enabled():
        for device in torch._C._autocast_supported_devices():
            if torch.is_autocast_enabled(device):
                torch.set_autocast_enabled(device, False)


class Lender:
    """What a run's host threads use to run its due updates while they wait."""

    __slots__ = ("_engine", "_run")

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._run: Callable[[Batch, float], float] | None = None

    def run_one(self) -> bool:
        """Run the update due earliest on the calling (host) thread, if one is due now that no
        thread has begun and the thread's settings allow; whether it ran one. No lock held."""
        if not fresh_settings() or in_hook_thread():  # a hook's wait runs no other node's update
            return False
        engine = self._engine
        policy = engine.policy
        with engine.lock:
            now = engine.clock.now()
            batch = policy.take_for_host(now)
            if batch is None:
                return False
        ident = _get_ident()
        try:
            run = self._run
            if run is None:
                run = self._run = batch_runner(engine, engine.workers)
            _host_hooks.running.add(ident)
            try:
                run(batch, now)
            finally:
                _host_hooks.running.discard(ident)
                if not fresh_settings():
                    _put_settings_back()
        except KeyboardInterrupt:  # the host's (threads.host-interrupt): the update ends there
            self._done()
            raise
        except BaseException as exc:  # Mujou's own code failed: hooks' exceptions are caught
            with engine.lock:
                policy.host_done()
                engine.crashed_locked(HOST, exc, exits=False)
            engine.raise_error()
            raise
        self._done()
        return True

    def _done(self) -> None:
        """Give the update back to the policy, and wake whom it asks for."""
        engine = self._engine
        with engine.lock:
            engine.policy.host_done()
            if engine.policy.wake:
                engine.deliver()
