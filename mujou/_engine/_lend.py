"""The host's thread runs due updates while it waits (NOTE [ the host lends its thread ]).

Guarantees:
- Only inside a host call that waits under the real-time timer (``Engine.wait_real``, used by
  ``run.wait_for``, and by ``run.sleep`` and ``run.join`` while ``defers``;
  ``Subscription.get``), one update at a time,
  taken from the policy as a worker takes it (``Workers.take_for_host``): earliest due first,
  and the node held meanwhile, so its hooks stay exclusive (threads.hooks-exclusive); or, under
  the virtual timer, inside a host call that moves the time (``Instants.advance``), one host
  thread at a time, the worker updates of each instant as a worker takes them
  (``Workers.take_instant_for_host``; all at once, ``Workers.take_alone``, where the thread
  is the only one that runs them: ``run_alone``, NOTE [ an instant run alone ] in
  ``_instants``). No job (``on_start``, ``on_stop``, ``state_dict``, ``load_state_dict``) and
  no dedicated node's hook.
- Under the real-time timer, the thread that receives the messages from another host runs the
  update a message made due the same way (``received``; hosts.receiver-runs-updates). One
  thread at a time runs the update ``take_for_host`` gives (``_busy``): they share its batch.
- The update runs through the workers' own runner (``_update.batch_runner``), so in the
  node's context, with its generator, streams and checks, as on a worker. While it runs the
  thread counts as a hook thread (``in_hook_thread``: the host's calls that wait refuse it).
- Per-thread torch settings (threads.host-thread-settings): the thread lends itself only
  while its own are a new thread's (grad mode on, inference mode off, no autocast, no torch
  function or dispatch mode), which a hook sees on a worker no hook changed; after each batch
  it ran (one update under the real-time timer, an instant's under the virtual one) grad mode
  and autocast are put back to those. The thread that runs a span of tags across processes
  (``begin_span``) checks them once for the span, then after each batch it ran what is not put
  back, and lends itself to no more tags once a hook left one of those.
- A KeyboardInterrupt that reaches the thread in the hook ends that update and propagates to
  the host (threads.host-interrupt). Any other exception in Mujou's code here stops the run
  with ``MujouInternalError``, which the host's call raises (run.internal-error).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch

from .._in_run import hooking, in_hook_thread
from ._arrivals import arrived, sent_arrived
from ._batches import HOST, Batch
from ._threads import Engine as ThreadsEngine
from ._update import batch_runner

if TYPE_CHECKING:
    from .._port import _Port

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


class Engine(ThreadsEngine, Protocol):
    """What the lender uses of the run's engine (``_lifecycle.Engine``, which makes it: a
    Protocol, so that this module does not import it)."""

    host: threading.Condition  # the host's waits
    poll: float  # the real seconds they sleep at most before they look again

    def raise_error(self) -> None: ...


IDLE_LOOKS = 500  # looks since the host's last write (a second), after which the writes wake again


class Lender:
    """What a run's host threads use to run its due updates while they wait.

    NOTE [ writes that wake no worker ]: a host that writes and then waits for the answer
    runs the update itself (``answer``), and a worker woken by the write found it taken: that
    wake-up, on another core or in the GIL, cost the host as much as its whole round trip. So
    once the host ran an update first thing in ``run.wait_for``, its writes wake no worker
    (``defers``), and the idle workers wait ``_threads.LOOK`` at most instead, so that the
    update of a write the host does not wait for still starts within about LOOK. A write before
    the host ran the previous one in a wait, or IDLE_LOOKS looks that found nothing since the
    host's last write (about a second: the host stopped writing), end it; all under the lock.

    Each write starts that count again. It used to count every empty look since the writes
    began to defer, and the host's round trips, whose updates the host runs, leave the
    workers nothing to find: in bench's echo-triggered (a trip every 1.2 ms or so) the
    writes woke the worker again after every 1.2-2.5 s of trips, 1 to 5 trips in a row each
    time, the worker racing the host for the update (13 trips of 5,280 in 6 s woke one,
    measured with the notifies counted; none from that cause after this). What still wakes
    one, in 0.1-0.4 % of such trips: an idle worker's timed look that took the update of a
    write before the host's wait did, after which the next write ends the deferral.
    """

    __slots__ = ("_busy", "_engine", "_instants", "_pending", "_run", "defers", "looks", "span")

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._run: Callable[[Batch, float], float] | None = None
        self.defers = False  # the host's writes wake no worker; idle workers look every LOOK
        self._pending = False  # a write while deferring, its update not yet run by the host
        self.looks = 0  # the idle workers' looks in a row that found nothing
        self._instants = 0  # virtual timer: the ident of the host thread lent to the instants
        self._busy = False  # real-time timer: a thread runs the update take_for_host gave it
        self.span = False  # virtual timer: lent to a span's tags (begin_span), settings still fresh

    def write_arrived(self, port: _Port, now: float) -> None:
        """A host write on ``port`` (which wakes nodes), published at timer time ``now``,
        arrives: as ``Engine.arrived``, but with no worker woken while the host's writes
        defer. A port that wakes one node tries ``Policy.host_wrote`` first (the common case,
        in one call)."""
        engine = self._engine
        policy = engine.policy
        with engine.lock:
            if self._pending:  # the host did not run the last one: wake workers again
                self.defers = False
            defers = self._pending = self.defers
            self.looks = 0  # the host writes: not idle (IDLE_LOOKS)
            wakes = port._wakes
            if len(wakes) != 1 or not policy.host_wrote(wakes[0], now, defers):
                policy.host_defers = defers
                try:
                    # ``sent_to_free``'s short path for a free node woken through one input.
                    sent_arrived(policy, port, now, None)
                finally:
                    policy.host_defers = False
            if policy.wake:
                engine.deliver()

    def idle_look(self) -> bool:
        """With the lock held: an idle worker's look (after LOOK) found nothing to do; after
        IDLE_LOOKS of them since the host's last write, its writes wake workers again.
        Whether they still wake none (``defers``)."""
        self.looks += 1
        if self.looks > IDLE_LOOKS:
            self.defers = False
        return self.defers

    def answer(self, hook_checked: bool = False) -> bool:
        """First thing in ``run.wait_for``, and in ``Subscription.get``: ``run_one``; if it ran
        an update, the host's writes defer from now on (NOTE [ writes that wake no worker ]).
        ``hook_checked``: the caller refused a hook thread already."""
        if not self.run_one(hook_checked):
            return False
        if not self.defers:
            engine = self._engine
            with engine.lock:
                self.defers = True
                self.looks = 0
                engine.parking.notify_workers()  # to wait LOOK at most from now on
        return True

    def run_one(self, hook_checked: bool = False) -> bool:
        """Run the update due earliest on the calling (host) thread, if one is due now that no
        thread has begun and the thread's settings allow; whether it ran one. No lock held.
        ``hook_checked``: the caller refused a hook thread already."""
        if not hook_checked and _get_ident() in hooking:  # a hook's wait runs no other node's update
            return False
        if (  # fresh_settings(), inlined: it runs in every wait_for
            not _is_grad_enabled()
            or _is_inference_mode_enabled()
            or _is_any_autocast_enabled()
            or _function_modes()
            or _dispatch_modes()
        ):
            return False
        engine = self._engine
        policy = engine.policy
        with engine.lock:
            if self._busy:  # another thread runs the host's update: one at a time
                return False
            now = engine.clock.now()
            batch = policy.take_for_host(now)
            if batch is None:
                return False
            self._busy = True
        self._run_taken(batch, now)
        self._pending = False  # the host runs updates as it waits: its writes may defer
        return True

    def _run_taken(self, batch: Batch, now: float) -> None:
        """Run ``batch``, which the policy gave the host's thread, from ``now``, and give it
        back. No lock held."""
        self._run_batch(batch, now)
        engine = self._engine
        with engine.lock:  # _done(), inlined: the round trip's last lock section
            self._busy = False
            policy = engine.policy
            policy.host_done()
            if policy.wake:
                engine.deliver()

    def _run_batch(self, batch: Batch, now: float) -> None:
        """Run ``batch``, which the policy gave the host's thread, from ``now``, with the
        thread counted as a hook thread meanwhile and its settings put back after; no lock
        held. Where it raises, the batch went back to the policy."""
        engine = self._engine
        ident = _get_ident()
        try:
            run = self._run
            if run is None:
                run = self._run = batch_runner(engine, engine.workers)
            hooking.add(ident)
            try:
                run(batch, now)
            finally:
                hooking.discard(ident)
                if not _is_grad_enabled() or _is_any_autocast_enabled():  # all it puts back
                    _put_settings_back()
                # A span's thread (``begin_span``): what fresh_settings() reads that is not put
                # back, left by a hook, ends its lending before the next tag.
                if (
                    self.span
                    and ident == self._instants
                    and (_is_inference_mode_enabled() or _function_modes() or _dispatch_modes())
                ):
                    self.span = False
        except KeyboardInterrupt:  # the host's (threads.host-interrupt): the update ends there
            self._done(interrupted=True)
            raise
        except BaseException as exc:  # Mujou's own code failed: hooks' exceptions are caught
            with engine.lock:
                self._busy = False
                engine.policy.host_done()
                engine.crashed_locked(HOST, exc, exits=False)
            engine.raise_error()
            raise

    def received(self, port: _Port, fresh: bool | None = None) -> None:
        """Under the real-time timer, on the thread that received a message from another
        process and made it visible on ``port`` (which wakes nodes): the arrival, then the
        update due earliest run on this thread, as a host thread waiting runs it (``run_one``),
        with no worker woken for it (hosts.receiver-runs-updates). An update this thread does
        not run (another thread runs the host's update, this thread's settings are not a new
        thread's, the update is not due yet, more are due) wakes the workers as any arrival.

        A port that wakes one node tries ``claim_for_host`` first (NOTE [ the receiver
        claims its update ] in ``_batches``): the same decision in a few lines. ``fresh``:
        ``fresh_settings()`` of the calling thread, where the caller read it since the thread
        last ran anything but Mujou's own code (after the last update it ran here), off the
        path from the arrival to the update; None: read here."""
        engine = self._engine
        policy = engine.policy
        takes = fresh_settings() if fresh is None else fresh
        wakes = port._wakes
        with engine.lock:
            now = engine.clock.now()
            takes = takes and not self._busy
            batch = policy.claim_for_host(policy.slots[wakes[0]], now) if takes and len(wakes) == 1 else None
            if batch is None:
                policy.host_defers = True  # no worker woken: this thread takes it below, or wakes one
                try:
                    arrived(policy, port, now)
                finally:
                    policy.host_defers = False
                batch = policy.take_for_host(now) if takes else None
                policy.wake_after_received(now, batch is not None)
                if policy.wake:
                    engine.deliver()
                if batch is None:
                    return
            self._busy = True
        self._run_taken(batch, now)

    def begin_instants(self) -> bool:
        """Virtual timer, with the lock held, as a host call begins to advance the time: whether
        the calling thread lends itself to the instants until ``end_instants`` (its settings
        allow, it runs no hook, and no other host thread lends itself now)."""
        if self._instants or in_hook_thread() or not fresh_settings():
            return False
        self._instants = _get_ident()
        self._engine.policy.host_lends = True
        return True

    def begin_span(self) -> bool:
        """``begin_instants`` for every tag of a span (proc.exchange) at once, on the thread
        that runs them all and nothing else between them (the host's ``mujou-lockstep``): its
        checks once, not once a tag. ``span`` stays true while the settings the updates leave
        on it are a new thread's (grad mode and autocast are put back after each; a hook that
        leaves another ends it), as ``begin_instants`` would find them at each tag; the caller
        then ends the lending (``end_instants``). Whether it lent itself."""
        self.span = self.begin_instants()
        return self.span

    def end_instants(self) -> None:
        """With the lock held: the host call that lent itself stops advancing. An instant it
        leaves half done (an interrupt) is the workers' again: they are woken for it."""
        engine = self._engine
        self._instants = 0
        self.span = False
        engine.policy.host_lends = False
        if engine.policy.instant:
            engine.parking.notify_workers()

    def lend_instants(self, done: Callable[[], bool]) -> None:
        """With the lock held (also when it returns or raises), on the thread ``begin_instants``
        lent: run the instants' worker updates until ``done()``, as a worker would
        (``Workers.take_instant_for_host``), waiting for the engine's notify meanwhile."""
        engine = self._engine
        policy, clock, lock = engine.policy, engine.clock, engine.lock
        while not done():
            now = clock.now()
            batch = policy.take_instant_for_host(now)
            if batch is None:
                engine.host.wait(engine.poll)
                continue
            lock.release()
            try:
                self._run_taken(batch, now)
            finally:
                lock.acquire()

    def run_alone(self, now: float) -> bool:
        """With the lock held (also when it returns or raises), on the thread lent to the
        instants, the instant at ``now`` begun and this thread the only one that runs its
        worker updates (NOTE [ an instant run alone ] in ``_instants``): ``lend_instants``'s
        work in one take, one run and one put-back, without its looks. Whether the instant's
        worker updates are over; False: nothing decided here, or some left (``lend_instants``
        goes on from there)."""
        engine = self._engine
        policy, lock = engine.policy, engine.lock
        w = policy.workers
        batch = policy.take_alone(w, now)
        if batch is None:
            return False
        if batch.todo:
            lock.release()
            try:
                self._run_batch(batch, now)
            finally:
                lock.acquire()
        over = policy.done_alone(w, now)
        if policy.wake:
            engine.deliver()
        return over

    def lends_here(self) -> bool:
        """Whether the calling thread is the one lent to the instants now."""
        return self._instants == _get_ident()

    def _done(self, *, interrupted: bool = False) -> None:
        """Give the update back to the policy, and wake whom it asks for. ``interrupted``: a
        KeyboardInterrupt ends the host's call, so under the virtual timer no thread that ends
        the instant may start the next one for the call's sleep (``advance_until``): the time
        would move on after the call raised."""
        engine = self._engine
        with engine.lock:
            if interrupted:
                engine.advance_until = None
            self._busy = False
            engine.policy.host_done()
            if engine.policy.wake:
                engine.deliver()
