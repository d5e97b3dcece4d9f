"""One update, top to bottom: what a worker does for each update of the batch it runs.

``batch_runner`` makes a worker's ``run(batch, start)``; for each update it begins the node's
update (``begin_update``'s steps, in place: its schedule, statistics and fresh bits), calls
``on_update`` in the node's context with the checks the spec asks for, and decides whether
the batch goes on, reading the clock in place. Every thread that runs worker updates runs
this one runner: a worker, worker 0 lent to a process's command thread, a host thread.
A node that needs more around its hook (CUDA streams, a trace, a profiler range) is called
through ``Hooks.call``, the one place that does all of it (jobs and dedicated threads use it
too); a plain CPU node's update is called here, with the same checks.

NOTE [ the cost of an update ]: how it was measured. The workload is bench's dispatch (100
empty nodes always due, one worker); the figure is the process's CPU time (``time.process_time``)
over the updates ``run.stats()`` counted in 1-2 s, so that a machine shared with other work
inflates it less than a rate would; ``py-spy record -r 1000 -f raw`` on the same workload gave
each step's share, and ``timeit`` each primitive alone (2-core AMD EPYC, CPython 3.11, torch
2.13). Before this module (load 3-6): 1.9-2.0 us an update under the virtual timer and
4.9-5.1 us under the real-time one; after: 1.4 us and 2.2-2.3 us (the real-time figure fell
most from NOTE [ taking what is due ], in ``_batches``). In the profile before, 40 % of the
worker's samples were the hook call with its checks, 14 % ``begin_update``, 13 % the runner's
loop. Each step, and what it costs now:

- taking the next node of the batch and deciding whether to go on: a few list and attribute
  operations, and under the real-time timer one clock read (``RealClock.now``, about 0.15 us);
- ``begin_update``, the fixed-rate schedule, ``dt``, the statistics and the lateness ring
  (sched.fixed-rate, sched.skip, observe.stats-values), about a quarter of the update, plus
  the fresh bits of each input (ports.fresh, trigger.coalesce);
- the hook in the node's context (threads.context): ``Context.run``, 0.04 us, and the call;
- the per-thread settings (rules.hook-settings-warning): 0.04 us for each of grad and
  inference mode, read once per batch and after each hook, no longer before it as well: the
  worker's own code between two hooks changes neither, so the value after one hook is the
  value before the next;
- the global seed (rules.manual-seed-warning): 0.05 us, read at the start of a batch and after
  each hook, no longer before each as well: between two hooks of a batch only Mujou's code
  runs on the worker, so a change seen after a hook was made while it ran, by it or by a hook
  running meanwhile, which the warning names. The host's thread reseeding in that gap would
  be blamed on the hook that follows, as it was before on a hook it overlapped; between
  batches (the host's calls) it is seen at the batch's start and blamed on no node;
- the busy time (observe.stats, observe.worker-busy): two ``perf_counter`` reads, 0.05 us each;
- the read-only check (ports.message-read-only): a loop over the messages the hook read only,
  so a node that read nothing pays one test of an empty list;
- the thread that runs the hook, which the ports check (ports.only-in-own-hooks): read once
  per batch instead of once per hook (0.03 us);
- whether torch's profiler runs (observe.profiler-ranges): one dictionary look-up (0.03 us);
- the hook itself, bound once per run (``Slot.update_hook``) instead of once per update.

The path from a send to the start of the update it triggers (bench's trigger-latency: a 1
ms sender, a node triggered by it, one worker), measured in place with ``perf_counter``
stamps around the send and at the triggered hook's start, medians of about 1,600 sends a
run, interleaved with the code before (2-core machine shared with other work, load 6-12;
the plain pool's whole send-to-start was 6.8-6.9 us in such runs). Before: the send with
its arrival 12-13 us (the send alone, without a node to wake, 4-5 us in place and 1.3 us
warm in a loop), then 3.8-4.0 us to the triggered hook; 15.8-17.4 us in all. Where the
arrival's time went (stamps at each step, before; each figure holds a stamp's 0.4 us):
taking the lock 1.4 us, the clock and noting the arrival (``arrive``) 2.5 us,
``Policy.arrival`` with ``arrivals_due`` and the hand-off (NOTE [ handing off ] in
``_policy``) 4.2 us, leaving the lock 2.3 us; after the send, the sender's update ends
(busy time, checks) in 1 us, the triggered node's ``begin_update`` takes 2.2 us and its
hook's call 1.1 us. Now ``Slot.sent`` is a positional ``partial`` of ``Engine.sent`` (a
keyword one built a dict per send), which notes the arrivals itself, and the policy's
decision reads each field once: the send with its arrival 9.2-11.1 us, 12.8-15.0 us in all
(about 2 us less). What is left is the Python of each step run cold, after the worker slept
a millisecond (in place every step costs 3-4 times what it costs in a warm loop): about 45
lines from the send to the hand-off, 60 more to the triggered hook. A path that takes no
lock and decides nothing per send would remove most of it: the sending worker claiming a
triggered node that only its own updates wake (a plan of the run, made at its start), so
that the node's due time and holder need no policy; not done (see issue 24, and NOTE [ the
send that hands off ] in ``_policy`` for what it would save): the stop, the jobs and the
host's take read a node's holder under the lock, so a claim without it needs them all to see
the node as held whenever its sender is. What was done instead: a send to a
free node woken through one input by ``on`` (``Slot.one_input``) takes
``Policy.sent_to_free``, ``arrive`` and ``arrival`` in one without their loops and held-node
checks. ``Engine.sent`` (the lock, the arrival, the hand-off), timed in place with
``perf_counter_ns`` around it (trigger-latency, load 3-4): 6.2-6.9 us before, 4.4-4.5 us
after; send to start, interleaved 4 times, 13.1-17.6 us before, 11.4-14.1 us after. In
``bench/run.py --quick --repeats 3 --only echo-triggered,trigger-latency`` at 92811bf, the
old and new code one after the other, twice (load 5-7, then 4-5): 12.6 and 12.0 us against
the plain pool's 6.77 and 7.32 us (1.87x, 1.64x); before, 13.0 and 14.2 us against 7.00 and
6.67 us (1.86x, 2.13x). The gain is smaller than the bench's spread between runs.

``python bench/run.py --quick --only trigger-latency,echo-triggered,chain-10,dispatch,
dispatch-virtual,fleet-1000`` at 36f4d1b (load 6.4, the other helpers' runs using 1.6-1.8 of
the 2 cores): trigger to start 12.7 us / 31.4 us (p50 / p99) against the plain pool's 6.6 us
/ 17.8 us (1.93x; 2.2-2.4x before, in the same conditions); the chain of 10, 66 us; empty
updates 185,000 / s real-time (0.70x the pool's) and 407,000 / s virtual (1.53x); the fleet
at N = 1,000, 11 us of CPU an update against the pool's 6.3 us (1.76x), both short of a core
there (0.37 and 0.64 of the updates made). An update of the fleet runs about 100 lines of
Mujou's Python around its two torch calls (``run`` 33, ``begin_update`` 28, ``send`` 15,
``read`` 12, the rest the batch's keeping and the clock, counted with a line tracer over a
batch); the pool's loop runs about 15. Each of Mujou's is a rule's (the statistics, the fresh
bits, the checks, the stamps); the ratio the issue asks needs fewer of them per update, not
cheaper ones: a compiled runner (mypyc) or statistics taken per batch instead of per update.

The compiled runner exists, opt-in: ``MUJOU_COMPILE=1`` (setup.py) compiles with mypyc this
module, ``_batches``, ``_ending``, ``_policy``, ``_slot``, ``_arrivals``, ``_clock`` and
``.._schedule``; the default install stays pure Python. ``python bench/run.py --quick
--repeats 3 --only dispatch,dispatch-virtual,fleet-1000,trigger-latency,echo-triggered
--systems mujou,heap_pool,floor``, compiled and pure alternated, three rounds (the third pure
first; load 1.3-4.4, the other helpers' work running), compiled against pure in each: empty
updates 503,000, 485,000 and 404,000 / s real-time against 283,000, 336,000 and 205,000
(1.4-2.0x; 0.76-1.01x the plain pool against 0.52-0.63x), 741,000, 865,000 and 658,000 / s
virtual against 488,000, 517,000 and 394,000 (1.5-1.7x; 1.24-1.67x the pool against
0.90-1.05x); the fleet at N = 1,000, 13.1, 12.9 and 11.1 us of CPU an update against 14.6,
12.8 and 13.7 (about 10 % less; 1.28-1.44x the pool against 1.39-1.69x, the target 1.2x not
met); trigger to start 16.0, 18.9 and 15.2 us against 16.6, 16.5 and 12.5, the host round
trip 85, 89 and 88 us against 86, 91 and 93: no gain. Where the time goes, compiled
(``py-spy record --native`` on the fleet): 72 % of the worker's samples are the hook
(``RingNode.on_update``: torch, and the ports' ``send`` and ``read``, 13 %: the ports are the
classes users declare on their nodes, left uncompiled); the engine's other 25 % are calls into
CPython and torch (``perf_counter``, the grad, inference and seed reads, ``Context.run``, the
lateness array), not interpretation. Trigger to start and the round trip spend theirs in the
uncompiled send, ``Engine.sent``, the lock, the wake-up and torch's copies
(NOTE [ the host's round trip ] in ``_run``).

The fleet at N = 1,000 counted in instructions, which a machine busy with other work does not
change (the CPU time per update of the same code varied by 15 % between two runs at load 3):
``valgrind --tool=callgrind --instr-atstart=no``, the instrumentation switched on and off from
node 0's hook at two of its updates (a two-line C helper with ``CALLGRIND_START_INSTRUMENTATION``
and ``CALLGRIND_STOP_INSTRUMENTATION``, through ctypes), over about 4,000 updates; the same
code twice gives counts within 0.2-1.5 %. Per update: the plain pool 37.8k, Mujou 53.4-54.2k
(at 0257045); the ring's body alone (its two torch calls and two appends, called in a loop)
21.6k; Mujou with a body that uses no port 43.1k. So the ports cost about 10k an update and the
engine about 5k more than the pool's heap, condition and ``next_slot``. Inside the ports, with
a loop of each call alone: ``read`` 3.15k and ``send(copy=False)`` 4.4k, of which each of
torch's properties (``_version``, ``is_cpu``, ``requires_grad``) is about 500, the thread check
(``threading.get_ident`` and the comparison) 600, the Python call 375, the tuple noting a
read 550. Each is a rule's (ports.message-read-only, ports.read-device, ports.send-snapshot,
ports.only-in-own-hooks); what is left to take out in pure Python is look-ups: the output's
slot and staged list read once, no iterator over an empty tuple of watchers, the reads list
bound once around the hook, and no ``max()`` call in ``next_slot``'s skip path, which an
overloaded worker takes at every update: 52.0k an update (2.7 % fewer; compiled, 44.3-45.2k
against 44.7k, no change beyond the count's spread). In time it is below the noise of this
machine: ``bench/run.py --quick --repeats 3 --only fleet-1000 --systems mujou,heap_pool``, new
then base (load 1.7, 1.5), 11.0 us against the pool's 7.63 (1.44x), 11.1 against 7.91 (1.41x);
alternated six times at load 2.3-2.6, medians 12.9 and 12.6 us. Compiling the ports
with mypyc would remove their Python calls and look-ups (an estimated 4-5k), not torch's
properties; not done (the ports are the classes users declare, so it needs
``allow_interpreted_subclasses`` and the whole suite run compiled).

Then the runner took ``begin_update``'s steps in place (the call, its arguments and its return
gone; ``next_slot``'s skip inlined, ``math.ceil`` bound once) and reads the real-time clock in
place (``RealClock.now``'s sum, the clock's fields read once a batch), and ``Engine.sent``
reads the clock in place too: the workers, a lent worker 0 and a host thread share this one
runner, and a dedicated thread still calls ``begin_update``, whose steps
``tests/test_update.py`` checks the runner's against. Counted as above (callgrind switched on
at node 0's third update and off at its fifth, about 2,000 updates; the script
``fleet_cg.py``, with the pool's ``pool_cg.py`` beside it, not in the repository): Mujou
47.9k instructions an update before (ab0b577), 45.7k after; the plain pool 35.6k (1.34x, then
1.28x; the target 1.2x is 42.7k). The send to
the start of the update it triggers (bench's trigger-latency net with a 10 ms sender, one
worker, callgrind on just before ``Output.send`` and off at the triggered hook's first line,
400 sends): 107.1-107.3k before, 103.0k after, twice each (``Policy.sent_handed``'s
inlined ``due_after`` and ``_first`` included: NOTE [ the send that hands off ] in
``_policy``). That harness counts far more than the 29k the last session's gave for the
same path, and a trivial Python loop put in its place runs about twice the instructions per
iteration there (on the worker, in a run) that it runs on the main thread alone; why was not
found: its figures are for A/B between commits only. (Found since: switching callgrind's
instrumentation on flushes its translations, so the instrumented sender ran so slowly that it
was due again before the triggered node, and the batch went back to the policy in between:
with a 10 ms sender the harness counted a path the bench does not run. With a 200 ms sender
the path is the bench's, 123 lines of Python, as a line tracer counts it without callgrind;
send to start 29.1k instructions, the plain pool's trigger to start 17.9k in the same harness,
each with the 3.5k of the two ctypes calls that switch callgrind.)

NOTE [ the clock between two updates ]: the runner used to read the clock twice between two
hooks: ``perf_counter`` for the busy time of the hook that returned, then the timer's clock
for the next update's start. Where ``perf_counter`` reads the clock the real-time timer
follows (``time.monotonic``: the same ``CLOCK_MONOTONIC`` on Linux, ``mach_absolute_time`` on
macOS; ``_ONE_CLOCK``), the read that ends the busy time is the next start, which now comes
a few hundred nanoseconds earlier, before the runner's checks of the hook that returned
(still after that hook: ``tests/test_update.py`` checks each start against the hook before
it). Under the virtual timer the start is not read again at all: a batch runs within one
instant and the clock moves only between instants. Callgrind (``--instr-atstart=no``, on and
off from a script through ctypes, 2-core AMD EPYC, CPython 3.11, torch 2.13): bench's
dispatch-virtual (100 empty nodes, one worker, ``run.sleep(0.05)`` instrumented, 5,000
updates) 11.77-11.79k instructions an update before, 11.44k after (the plain pool's dispatch
13.2k an update, its worker's whole loop over a second); trigger-latency's send to start
(the harness above, 60 sends of a 200 ms sender) 29.1k before, 28.8k after.

Whether the two hot-path copies still pay (the runner's ``begin_update`` steps in place, and
``Policy.sent_handed``'s inlined ``Workers.claim``), counted as above at 281443c with each
folded back into a call (the runner calling ``begin_update``; ``sent_handed`` calling
``claim`` and ``_join``): pure Python, dispatch-virtual 11.77k instructions an update with
the copy, 12.34k with the call (+4.8 %); send to start 29.1k with the copy, 30.6k with the
call (+5 %). Compiled (``MUJOU_COMPILE=1``, both folds in one build): 7.49k against 7.76k an
update (+3.6 %); send to start 23.6-24.4k (two runs) against 24.5k, within the harness's
spread. So both copies stay; ``tests/test_update.py`` keeps the runner's steps equal to
``begin_update``'s, and ``Workers.claim``'s docstring points at ``sent_handed``'s copy.

The fleet at N = 1,000 counted again for issue 24 (callgrind on at node 0's third update and
off at its fifth, each boundary read outside the count, about 1,950 updates; 2-core AMD EPYC,
CPython 3.11, torch 2.13): the plain pool 35.9k instructions an update, Mujou 45.6k and
46.7k at 942ff87, 44.4k and 46.7k with the planned hand-off of NOTE [ the send that hands
off ], whose path the fleet does not take (1.24-1.30x; the target 1.2x is 43.0k). Its process CPU
per update (``_cpu_per_update_us`` of ``python -m bench._one mujou fleet '{"n": 1000,
"seconds": 2.0, "workers": 1}'`` and the same for ``heap_pool``), alternated at load 2: 7.9
and 8.0 us against the pool's 5.5 and 5.5 (1.45x): the ratio in time is above the ratio in
instructions, the nodes' slots and ports being many more objects to touch than the pool's
closures. What the difference is spent on is as counted above: the ports' rules (the
thread check, the read-only stamps, the device and grad checks: about 10k an update) and
the engine's statistics, fresh bits and checks (about 5k beyond the pool's heap).

Issue 24, the read-only check (ports.message-read-only) without a tuple per read: the first
message a hook reads from an input is noted on the input (``Input._read``, the port's
``_latest`` tuple itself, no new one), and the runner checks the node's inputs after the
hook; only a second, other message read from the same input (one that arrived meanwhile) goes
to the node's ``reads`` list as before. Counted with the harness above (``/tmp/rules/fleet.py``
beside ``runcg.sh``, not in the repository; callgrind on at node 0's third update and off at
its fifth through a two-line ctypes helper, about 1,950 updates, the same machine), the base
b8e76db and the change alternated: 44.14k, 44.14k and 44.16k instructions an update before
(a first, cold run 45.26k), 43.80k, 43.82k, 43.82k and 43.88k after (-0.3k, 0.75 %); the
plain pool 35.78k in the same harness (``pool.py``), so 1.23x against 1.24x (the target 1.2x
is 42.9k). The send to the triggered start (``trig.py``: bench's trigger-latency net with a
0.5 s sender, on just before ``send``, off at the triggered hook's first line, 19 sends, each
figure with the two ctypes calls) does not take this path: 35.99k and 36.18k before, 36.21k
and 36.30k after. Tried and dropped: ``type(value)`` for ``value.__class__`` in ``send``
(43.88k, no gain). What is left of the fleet's difference is each a rule's call into torch
or CPython, counted per update with ``callgrind_annotate --inclusive=yes``: ``_version`` 843
(three reads: the send's, the read's check, the check after the hook), ``is_cpu`` 486 (send
and read), ``perf_counter`` 354 (the busy time), ``requires_grad`` 245, the seed's
``initial_seed`` 238, ``get_ident`` 225 (the two ports' thread checks); the rest is the
Python of the runner's steps and the two port calls. A message's device and grad facts
could be carried in its ``_latest`` tuple from the send (the read's ``is_cpu`` gone), but
that tuple has producers in the processes' stand-ins as well (``_processes/_wire.py``,
``_mirrors.py``): not done here.

Done since (issue 24, the fleet's CPU per update): ``Latest`` carries whether the message
is a bare CPU tensor, set where it is published (send's hot path from the ``is_cpu`` it asked
already; ``_publish``; the stand-ins), so ``read`` asks torch only the version; a send with
``copy=True`` records version 0 for its new clone; the lateness ring is written through a
memoryview of an array of zeros (array's own ``append`` and setitem parse the float with
``PyArg_Parse``: 650 and 480 instructions alone, the memoryview's setitem 340, and the branch
on a full ring goes); dt's sum is one subtraction, ``last - dt_from``. The harness is in the
repository now: ``bench/fleet_callgrind.py`` (its docstring gives the command), for Mujou and
the heap pool; with ``GC=0``, ``PYTHONHASHSEED=0`` and ``setarch -R`` a run repeats within
0.2 % at ``PERIOD=8`` (every round of 1,000 updates one batch, as a system that keeps up);
at the bench's 10 ms every update skips under callgrind and the batches change with the
timing, 2-3 % apart. At ``PERIOD=8``: 41.56k instructions an update at 3fa933c, 40.33k and
40.36k now; the heap pool 34.24k (1.214x, now 1.178x). At 10 ms: 44.55k and 44.62k before,
42.95k and 43.62k now; the pool 35.74k (1.25x, now 1.20-1.22x). What is left is each a
rule's: per update the runner runs about 290 bytecodes (the pool's loop 113 and its
``next_slot`` 30), ``send`` 83 and ``read`` 55, and nine calls into torch the pool does not
make (``_version`` three times, ``is_cpu`` and ``requires_grad`` on the send, the grad,
inference and seed reads: 400-530 instructions each, most of it torch's binding code), the
two thread checks (500 each, ``get_ident`` and its int), ``Context.run`` (300 more than a
call). The node's own ``self.x`` and ``self.y`` are generic attribute look-ups: a port
declared on the class is an instance of a mutable class, which CPython 3.11 does not
specialize ``LOAD_ATTR`` past (43 ns against 24 ns for ``self.w``); a class attribute of an
immutable type that is not a data descriptor would, but then ``node.y = ...`` would no longer
raise (ports.declare) without a ``__setattr__`` that slows every store.

NOTE [ the memory an update touches ]: issue 24's trigger-to-start and fleet targets are met in
instructions (above) but not in time, and the time left was put down to cold caches. Counted
with callgrind's cache and branch simulators, which a busy machine does not change: the
harnesses ``bench/trigger_callgrind.py`` and ``bench/fleet_callgrind.py`` (their docstrings
give the command lines; ``bench/_callgrind.py``: this machine's caches, 32 KiB L1s and the 1
MiB L2 as the last level, and the flush that empties them and the branch predictors, not
counted). The trigger's path (send to the triggered hook, a 1 s sender, medians of sends
11-20) with the caches and predictors emptied at the end of each triggered update, so that
the wake-up and the sender's update warm what they touch as in the bench (``FLUSH=end``;
``--branch-sim=yes``; ``setarch -R``, ``PYTHONHASHSEED=0``), at 5ddbd5d, beside the plain pool
(the harness now marks each send by dumps instead of switching the instrumentation, and counts
0.2-0.4k instructions more on both sides than NOTE [ the send that lodges ] in ``_lodge``
quotes, 18.4k and 16.5k there):

=========================  ===========  ===========
per send                   Mujou        plain pool
=========================  ===========  ===========
instructions               18.57k       16.89k
L1 instruction misses      547          561
L1 data misses             480          234
L2 misses, code + data     28 + 129     95 + 96
branches mispredicted      189          91
indirect jumps mispred.    411          305
bytecodes (a line tracer)  426          212
=========================  ===========  ===========

With every cache emptied just before the send (``FLUSH=send``: each line the path touches is
a miss), the lines touched are 514 + 492 (code + data) against the pool's 506 + 343: 1.18x;
with pages for lines (``_callgrind.PAGES``, the TLBs' stand-in; ``FLUSH=end``), 115 + 249
pages missed at the first level against 69 + 225, and 1 + 23 at the second against 8 + 28.
So the memory the path touches is not what makes the 1.8x in time (the pool's p50 2.5-3.6
us, Mujou's 6.3-9.1 us with the sender at 1 ms): after the wake-up Mujou even misses the L2
less than the pool (its wake and the sender's update warm what the path reuses). What is
about 2x is the first level and the predictors, which the interpreter's work per bytecode
fills: the data misses (2.05x), the mispredicted branches (2.1x) and the bytecodes (2.0x:
the runner 247 from the sender's hook's end to the next hook, ``send`` 88, the lodge 69;
the pool's loop 118, its ``trigger`` 44 and the ``Condition``'s methods 38), each dispatched
through an indirect jump that is mispredicted when cold. The fleet at N = 1,000 (``PERIOD=8
GC=0``, 2,000 updates; every update's working set overflows the L1s) per update: Mujou 40.34k
instructions, 2,008 L1 instruction misses, 967 L1 data misses, 73.5 L2 data misses; the pool
34.24k, 1,945, 742, 52.4. At about 14 cycles an L2 hit and 50 an L3 hit, the 224 extra L1
data misses cost about 1 us, the 21 L2 misses 0.35 us, the 6.1k instructions about 1 us: the
2.5 us between the two systems' CPU per update (8.0 against 5.5 us), with no one cause.

Tried, counted, and dropped (each within the counts' spread of run to run, about 10 L1 data
misses a send and 1 an update, or worse): the fields each update reads first in the
``__slots__`` of ``Slot``, ``NodeCore`` and the ports (so that an update touches two lines
of a slot instead of five): 480 L1 data misses a send, 483 after; the fleet 966.7 and 969.1,
73.5 and 73.3 L2 misses. The lodge's closure as one object with ``__slots__`` (a closure keeps
each free variable in a cell of its own): 10 L1 data misses and 12 data lines fewer, but 150
instructions and 22 bytecodes more (``self.`` and an attribute for each cell). The lateness
ring written through its array instead of the memoryview: the fleet's L2 misses 73.3 to
71.7, 160 instructions more. What would remove the difference is fewer bytecodes on the
path, about 40 % of them for 1.2x: each rule step in Python costs a few, each a dispatch.
A compiled runner and compiled ports (``MUJOU_COMPILE=1`` compiles the runner today, not the
ports or ``_lodge``) dispatch none; or one function from the send to the next hook (the
lodge's checks, the end of the sender's update and the start of the next), not one per step.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from .._schedule import next_slot
from .._stats import LATENESS_WINDOW
from ._clock import RealClock
from ._hooks import changed_read, check_reads, forget_reads, profiler

if TYPE_CHECKING:
    from ._batches import Batch
    from ._clock import Clock
    from ._hooks import Hooks
    from ._policy import Policy
    from ._slot import Slot

# Bound once: each runs for every update.
_get_ident = threading.get_ident
_perf_counter = time.perf_counter
_is_grad_enabled = torch.is_grad_enabled
_is_inference_mode_enabled = torch.is_inference_mode_enabled
_initial_seed = torch.default_generator.initial_seed
_ceil = math.ceil
# Whether perf_counter reads the clock the real-time timer follows (time.monotonic), as on
# Linux and macOS: then the read that ends a hook's busy time starts the next update.
_ONE_CLOCK = (
    time.get_clock_info("perf_counter").implementation == time.get_clock_info("monotonic").implementation
)


class UpdateEngine(Protocol):
    """What a worker's batch runner uses of the run's engine (``_lifecycle.Engine``, which
    starts the workers: a Protocol, so that this module does not import it)."""

    lock: threading.Lock
    policy: Policy
    hooks: Hooks
    workers: int

    @property
    def clock(self) -> Clock: ...
    @property
    def slots(self) -> Sequence[Slot]: ...

    def deliver(self) -> bool: ...
    def report(self, slot: Slot, hook: str, at: float, exc: BaseException) -> None: ...


def begin_update(slot: Slot, start: float, traced: bool) -> float:
    """``slot``'s update starts at ``start``: its statistics and its next due time
    (sched.fixed-rate, sched.skip); returns its dt.

    Called by the thread holding the node, without the lock: that thread alone touches these.
    A dedicated thread calls it; ``batch_runner`` does the same steps in place (NOTE [ the
    cost of an update ]), which ``tests/test_update.py`` checks against this.
    """
    period = slot.period
    was = slot.due
    lateness = start - was
    number = slot.slot
    periodic = number * period  # the due time of its next periodic update
    if was < periodic and start < periodic:
        due = periodic  # a triggered update, ahead of the periodic one: that one stays due
    else:
        following = number + 1
        due = following * period  # due_time(following, period), inlined
        if due < start:  # more than a period late: skip (sched.skip)
            following, skipped = next_slot(number, period, start)
            slot.skipped += skipped
            due = following * period
        slot.slot = following
    slot.due = due
    dt = start - slot.last
    slot.last = start
    done = slot.updates
    slot.updates = done + 1
    if dt < slot.dt_min:
        slot.dt_min = dt
    if dt > slot.dt_max:
        slot.dt_max = dt
    if lateness > slot.lateness_max:
        slot.lateness_max = lateness
    slot.lateness_ring[done % LATENESS_WINDOW] = lateness
    if traced:
        _note_now(slot, start, dt, lateness)
    for port in slot.inputs:  # Input.fresh: the number of the latest message at this start
        source = port._source
        latest = (port if source is None else source)._latest
        seen = port._seen_before = port._seen
        number = port._seen = 0 if latest is None else latest[4]
        if number - seen > 1:  # arrivals no update saw fresh (trigger.coalesce)
            replaced = number - max(seen, port._base) - 1
            if replaced > 0:
                port._coalesced += replaced
    return dt


def _note_now(slot: Slot, start: float, dt: float, lateness: float) -> None:
    """Tracing: the running update's t, dt, lateness and the flows into it (``slot.now``)."""
    flows = slot.flows_in
    if flows:  # appended to under the lock: an arrival meanwhile stays for the next update
        taken = flows[:]
        del flows[: len(taken)]
        slot.now = (start, dt, lateness, taken)
    else:
        slot.now = (start, dt, lateness, None)


def batch_runner(engine: UpdateEngine, w: int) -> Callable[[Batch, float], float]:
    """Worker ``w``'s ``run(batch, start)``, with what it reads bound once (it runs per batch);
    ``w == engine.workers``: the host's (NOTE [ the host lends its thread ] in ``_batches``).
    Every thread that runs worker updates runs them here: the workers, worker 0 lent to a
    process's command thread (``_threads.Lent``) and a host thread (``_lend.Lender``)."""
    policy, clock, slots, hooks, lock = engine.policy, engine.clock, engine.slots, engine.hooks, engine.lock
    call = hooks.call
    host = w == engine.workers
    in_hook = policy.gil.in_hook if policy.gil is not None and not host else None
    traced, now_of, virtual = hooks.trace is not None, clock.now, clock.virtual
    # Read in place (RealClock.now) where the read that ends a hook's busy time reads the real
    # time the clock follows (its source: time.monotonic, the same clock as perf_counter where
    # _ONE_CLOCK); elsewhere through now_of(), as any other clock.
    real = (
        clock
        if isinstance(clock, RealClock)
        and (clock.source is _perf_counter or (_ONE_CLOCK and clock.source is time.monotonic))
        else None
    )
    one_worker = engine.workers == 1
    inf = float("inf")

    def run(batch: Batch, start: float) -> float:
        """Run ``batch``'s updates in turn, the first at ``start``, no lock held; return the
        seconds spent in hooks.

        Ends early, leaving the rest to the policy: when a worker is needed for something else
        (a job, a pause, the stop), when an update failed under the real-time timer, and when
        a node that ran is due again before the rest (from the queue, another worker may take
        it first: threads.earliest-due-first).
        """
        todo, ran = batch.todo, batch.ran
        spent = 0.0
        again = inf  # the earliest next due time of the nodes that ran
        ident = _get_ident()  # the hook thread the ports check (ports.only-in-own-hooks)
        # The worker's per-thread settings now: after each hook they are compared with these.
        grad, inference = _is_grad_enabled(), _is_inference_mode_enabled()
        if _initial_seed() != hooks.seen_seed:  # reseeded since the last hook: not by this batch
            hooks.observe_seed(None)
        seed = hooks.seen_seed  # as the hooks saw it last: another worker's may move it on
        # The real-time clock's fields: fixed once the timer started, as it has for any update.
        # Under the virtual timer ``start`` stays: a batch runs in one instant, and the clock
        # moves only between instants.
        origin, started, scale = (0.0, None, 1.0) if real is None else (real._origin, real._start, real.scale)
        while True:
            try:
                slot = slots[todo.pop()]
            except IndexError:  # another worker took the last one
                break
            if in_hook is not None:  # a CUDA node waits for its stream outside the GIL
                in_hook[w] = 0.0 if slot.cuda else _perf_counter()
            # begin_update, in place (the same steps: tests/test_update checks they agree).
            period = slot.period
            was = slot.due
            lateness = start - was
            number = slot.slot
            periodic = number * period  # the due time of its next periodic update
            if was < periodic and start < periodic:
                due = periodic  # a triggered update, ahead of the periodic one: that one stays due
            else:
                following = number + 1
                due = following * period  # due_time(following, period), inlined
                if due < start:  # more than a period late: skip (sched.skip), next_slot inlined
                    first = _ceil(start / period)
                    if first < following:
                        first = following
                    while first * period < start:  # ceil of a float quotient can land one short
                        first += 1
                    slot.skipped += first - following
                    following = first
                    due = first * period
                slot.slot = following
            slot.due = due
            dt = start - slot.last
            slot.last = start
            done = slot.updates
            slot.updates = done + 1
            if dt < slot.dt_min:
                slot.dt_min = dt
            if dt > slot.dt_max:
                slot.dt_max = dt
            if lateness > slot.lateness_max:
                slot.lateness_max = lateness
            slot.lateness_ring[done % LATENESS_WINDOW] = lateness
            if traced:
                _note_now(slot, start, dt, lateness)
            inputs = slot.inputs
            for port in inputs:  # Input.fresh: the number of the latest message at this start
                source = port._source
                latest = (port if source is None else source)._latest
                seen = port._seen_before = port._seen
                number = port._seen = 0 if latest is None else latest[4]
                if number - seen > 1:  # arrivals no update saw fresh (trigger.coalesce)
                    replaced = number - max(seen, port._base) - 1
                    if replaced > 0:
                        port._coalesced += replaced
            core = slot.core
            failed: BaseException | None = None
            if core.streams is None and not traced and not profiler._is_profiler_enabled:
                # The hook alone, with the checks of Hooks.call that can fail for a plain CPU
                # node (NOTE [ the cost of an update ]).
                slot.hook = "on_update"
                core.hook_thread = ident
                began = _perf_counter()
                try:
                    core.context.run(slot.update_hook, dt)
                    # ports.message-read-only, on the messages it read: the first of each
                    # input is noted on the input (Input._read), any other in ``reads``.
                    for port in inputs:
                        read = port._read
                        if read is not None:
                            port._read = None
                            if read[0]._version != read[1]:
                                changed_read(slot, "on_update", port)
                    if core.reads:  # a second message of an input, or one not on the CPU
                        check_reads(slot, "on_update")
                        core.reads.clear()
                except BaseException as exc:
                    failed = exc
                    forget_reads(slot)
                ended = _perf_counter()
                busy = ended - began
                slot.busy_seconds += busy
                spent += busy
                core.hook_thread = 0
            else:
                before = slot.busy_seconds
                failed = call(slot, "on_update", slot.update_hook, dt)[1]
                spent += slot.busy_seconds - before
                ended = _perf_counter()
            if (
                _is_grad_enabled() is not grad
                or _is_inference_mode_enabled() is not inference
                or _initial_seed() != seed
            ):
                hooks.check_settings(slot, "on_update", grad, inference)
                grad, inference, seed = _is_grad_enabled(), _is_inference_mode_enabled(), hooks.seen_seed
            ran.append(slot)
            if failed is not None:
                if host and isinstance(failed, KeyboardInterrupt):
                    raise failed  # the host's, not the hook's (threads.host-interrupt)
                with lock:
                    engine.report(slot, "on_update", slot.last, failed)
                    policy.update_failed(batch)
                    if policy.wake:
                        engine.deliver()
            if slot.due < again:
                again = slot.due
            if not todo or policy.jobs or policy.paused or policy.stopping:
                break
            # The next update's start (NOTE [ the clock between two updates ]).
            if started is not None:
                start = origin + (ended - started) * scale
            elif not virtual:  # another clock (a test's), or perf_counter is not the timer's clock
                start = now_of()
            # With one worker no other worker could take a node that is due again; it waits
            # only if it is due before the next of the batch (threads.earliest-due-first).
            if start >= again and (not one_worker or again <= slots[todo[-1]].due):
                break
        return spent

    return run
