"""The wake pipes into this process, under the real-time timer: who waits on them, and what
taking a record does (proc.wake).

Each process that sends here has a pipe of records (``_wire.Pipe``), each of which says "the
newest slot of output NAME's ring is new" (or announces a new ring). Taking a record copies
that slot out, publishes it on the output's stand-in and wakes the triggered readers.

Where the host or a child has workers (Linux), the idle workers wait on the pipes themselves:
each parks on a ``ListeningGate``, an epoll of its own over its wake-up (an eventfd, which
``Parking``'s notify writes) and every inbound pipe. A record then wakes a parked worker, which
takes it and claims the update it makes due at once (``Policy.received_to_free``) and runs it
there, inside its wait (``ListeningGate._run``); where it cannot claim it (another update is
due first, a job, more than one node woken), the update is due at once with that worker
preferred (``Parking.prefer``). Either way the worker that read the record runs the update,
with no hand-off to another thread. One thread of Mujou's (``mujou-ports-in``) waits on the
pipes too, for when no worker is idle (every worker in a long update, or none in this
process), so that a message never waits for an update to end before it is published.

The pipes are registered in the epolls with ``EPOLLEXCLUSIVE``, the workers' first: a record
wakes one waiter, and the kernel tries the waiters in the order they were registered, so an
idle worker is woken rather than the thread. Which one is woken only decides who takes the
record: every reader of a pipe reads it without blocking, under the pipe's own lock, so
records are taken whole and in order by whoever comes first, and level-triggered epolls
leave nothing unread.

NOTE [ the hand-off between processes ]

Send to read of the bench's cross-process workload (a 256 B tensor every millisecond from a
node in a child to a triggered node in the host, workers=1), per step, p50 of the time since
the sender's stamp (``time.monotonic`` just before ``send``), load 2-3 on 2 cores; 64 KiB in
brackets. Before (a receiver thread per pipe, which woke a parked worker):

    the sender (in the child)                                   cumulative
      send() to its watcher: checks, the latest, the stamp         6.8  (7.5)
      split the message                                           10.1 (11.6)
      ring.write: layout check, fences, copy into the slot        24.4 (33.5)
      Pipe.send: the lock, what is owed, os.write                 45.2 (52.2)
    the host
      the receiver thread wakes: recv_bytes returns               60.2 (77.8)
      pickle.loads, RingReader.latest (copy out), joined          86.9 (113)
      the stand-in set, the engine's lock taken                   91.2 (118)
      arrive() for the triggered node                            103   (132)
      deliver: the parked worker's gate released                 121   (147)
      the worker wakes, takes the GIL and the lock, asks the
        policy, begins the update: on_update starts              145   (179)
      its read returns                                           147   (182)

The floor in the same session: 29-45 µs (a slot copied in, a byte through a pipe, a
blocked os.read, the slot copied out). Every step here runs cold: the process slept for the
millisecond between messages, and each costs 3-4 times what it costs in a warm loop. The
receiver thread's hand-off to the worker (deliver, the worker's wake-up, its wait for the
GIL the receiver held) was about 40 µs of it; a parked worker that reads the pipe itself
removes it. What is left is the Python of each step, measured again below.

After (a parked worker takes the record and runs the update; the record written at once,
``_wire.Pipe.send``; the slot copied into tensors made while the worker was idle,
``RingReader.prepare``; no reader fence on x86-64), 256 B, load 5-6, the floor 35-39 µs in
the same minutes:

    the sender (in the child)                                   cumulative
      send() to its watcher                                        7.0
      ring.write (the bare tensor's path)                         23.0
      Pipe.send: the lock, one os.write                           31.8
    the host's worker
      wakes in its epoll: Inbox.receive entered                   59.4
      the pipe read, the slot copied into the spare, joined       83.8
      the stand-in set (Standins.publish)                         90.6
      _arrived: the lock, arrive(), deliver (its own gate only
        marked open: no syscall)                                 107.5
      back through Parking.wait and the worker's loop, the
        policy's take, begin_update: on_update starts            118.2
      its read returns                                           119.8

What is left, and what would remove it: the wake-up itself is the floor's (a bare pipe
and epoll, or a blocking read, in a thread: 16-25 µs here); the rest is about 80 µs of
Python run cold, each step 3-4 times its warm cost: the ring's write (the layout check,
two ctypes fences, torch's copy) 15, the pipe 9, the copy out 25, the arrival and the way
back to the update 28 (the path of trigger to start within a process, ``_update``'s NOTE
[ the cost of an update ]).

Then (issue 24, measured again with a timestamp after each step, base and new alternated
in the same minute, 256 B, load 6.4; each column the p50 of one 4 s run):

    cumulative p50 from the stamp                             base    new
      the watcher entered (send())                             8.4    6.5
      ring.write done                                         25.2   16.2
      Pipe.send done (the os.write that wakes the reader)     50.7   24.5
      the worker wakes in its epoll                           75.0   51.3
      the pipe read                                           83.2   57.3
      the slot copied out                                    103.1   66.2
      the stand-in set                                       113.5   73.7
      _arrived done                                          134.7   84.2
      on_update starts                                       150.7   96.3

(another pair of runs in the minute before: 196 and 175 µs; the load moves each figure by
tens of µs, so compare within a pair). What changed: the ring's plain path (NOTE [ the
plain path ] in ``_ring``: a memmove, memoryviews for the header and the copy out, no
torch or ctypes call on the reader's path); one read of one known record looked up whole;
and, the largest, the arrival: with one worker the reader was held in a kept batch between
messages (it is due never, NOTE [ keeping a batch ]), so each arrival put that batch back
through ``Policy.arrival``'s general path (about 17 of its 21 µs); it is no longer kept,
and the arrival takes ``Policy.sent_to_free`` as a send within a process does.

What is left, finer (load 5-7): the write's checks of the tensor 3.4 and the memmove, a
ctypes call, 4.6 (cold; 0.6 warm); the os.write that wakes the reader 12.6 (the floor pays
it too); the pipe's read 4.7; the copy out 9-12; the publish 7; the arrival 10 (the lock,
``prefer``, ``sent_to_free``, the queue, ``deliver``); the worker's loop, ``next_for_worker``
(9) and ``begin_update`` (5) to on_update. With the wake-up at the floor's (25-40 µs here),
1.5x the floor leaves 20-35 µs for all the Python of both processes, about a third of what
it takes now: what would remove most of it is the worker that takes a record claiming the
update it triggers directly (its own batch, held, without the queue, ``_wake_idle`` and
``next_for_worker``: about 20 µs of the above), and a compiled record path (the write, the
read and the publish: each step's Python, not its memory, is the cost).

Then (issue 24, helper proc3). Send to read, 256 B, base 0257045 and new alternated, each
pair in the same half minute, p50 of one 3 s run each, load 5-7 (another helper's work: the
figures move by 10-30 µs from run to run):

    base   115  136  147  136  141  130  146     median 136 µs
    new    123  146  135  140  108  126  114     median 126 µs
    64 KiB, load 5.8-6.5:
    base   161  155  155                          median 155 µs
    new    144  137  159                          median 144 µs

and a stamp after each step (load 3-4): from the stand-in set to the batch begun took 23-25
µs before and 16-18 after. The worker that took the record claims the update it makes due
now as its own held batch (``Policy.received_to_free``, NOTE [ claiming a received update ]):
no queue push, no wake logic, no search of the queue in ``next_for_worker``. The sender's
watcher writes a bare CPU tensor without ``split`` and its pipe checks what it owes inline
(about 1 µs, inside the noise). ``bench/run.py --quick --repeats 2 --only
cross-process-256B,cross-process-64KiB``, alternated twice at load 6-8: base 2.11x and
2.11x (256 B), 1.65x and 1.89x (64 KiB); new 2.56x and 1.67x, 1.37x and 2.01x: the target
(1.5x) is not met, and these runs cannot tell the two apart.

What the wake-up costs, and why: from the os.write to the worker awake took 30-40 µs at load
3-6, against 13-14 µs when the sender yields its CPU just after the write (os.sched_yield,
tried and not kept; read in 118-121 µs against 133-147 in the same minutes). A write to a
pipe wakes its reader as a *sync* wake-up (``wake_up_interruptible_sync_poll``, passed on by
epoll), which lets the kernel put the woken thread on the writer's CPU when the writer is the
only task there and the reader's own CPU is busy, expecting the writer to sleep at once (our
reading of the scheduler's code, which the yield's figures bear out). The floor's
sender does; Mujou's goes on with the rest of its update, the worker's loop and its wait,
15-25 µs of Python, while the reader waits for that CPU. A yield would hand the sender's CPU
to any other runnable task for up to a slice (EEVDF moves the yielder's deadline one slice
on): a late sender on a busy machine, so it is not in. What would remove the wait: a wake-up
that is not sync, an eventfd per pair of processes (``eventfd_write`` wakes plainly), written
after the record, registered in the epolls instead of the pipe (the pipe read without
blocking after the eventfd is read back, and watched by the thread for its end only); and the
Python of the host's steps, now about 50 µs run cold, compiled.

Then (issue 24, helper proc, 2026-12-04), counted rather than timed. Syscalls per hand-off
(``strace -f`` over 500 hand-offs of the bench's 256 B case): the sender's worker one
``write`` (the record) and one ``futex`` (its wait for the next period), as the floor's
sender (one ``write``, one sleep); the host's worker one ``epoll_wait`` and one ``read``, the
floor's reader one ``read``. One wake-up a hand-off on each side, as the floor: none to remove.
The thread (``mujou-ports-in``) took 1-3 % of the records (``receive`` with no worker), those
the worker was not parked for yet; they pay a second wake-up, in the tail only.

Where the wake-up lands: the woken worker runs on the sender's CPU (the other one busy with
other work at load 4-7), so it waits for what the sender does after its write (the end of its
update and its park, about 20 µs of Python): a ``sched_yield`` after the write cut the wake
(write to ``receive``) from 32-38 to 13-21 µs, but the sender's rest then ran inside the
receiver's steps, and send to read did not change (108, 123 µs without; 122, 111 with). The
eventfd per pair of processes (its write is not a sync wake-up, so the kernel need not put the
reader on the writer's CPU), tried in a bare two-process probe (a byte or an eventfd, the
sender going on 25-30 µs after it, epoll with ``EPOLLEXCLUSIVE`` as here, load 5-7): p50 19-49
µs through the pipe, 32-57 µs through the eventfd, the reader on the sender's CPU 76-100 % of
the time either way. Not built: on a busy machine the two processes share one CPU whatever
wakes the reader, and the latency is the sum of their CPU work.

That work, cumulative p50 from the stamp (load 4-5, base and new alternated): the ring
written 21-23 µs, the record written 34-39, the worker in ``receive`` 70-79, the slot copied
89-100, published 101-114, ``_arrived`` done 112-126, ``on_update`` 125-142; the floor's
whole hand-off 40-58 µs in the same runs. Warm, in one process (a loop of send, ``prepare``
and ``receive``, no wake-up): the send 4.3 µs, ``prepare`` 4.7 (off the path: before the
worker parks), ``receive`` 4.7; run cold, after a millisecond of other processes on the core,
the same steps take 4-6 times that. 1.5x the floor leaves about 25 µs for the Python of both
processes where they take about 90 now: what would remove it is not a wake-up but a compiled
path for the send (the watcher, the ring's write, the record) and for the receive through to
the claimed update (the read, the copy, the publish, the claim), small enough to stay in cache.

Then (issue 24, helper proc, 2026-12-04 afternoon). No second wake-up is left on the path:
with a stamp where the thread takes a record, the parked worker took 98.6-99.9 % of them
(the thread ``mujou-ports-in`` 2-40 of about 3000 a run) and ran the update it claimed
(proc.wake-worker). A stamp after each step, in a copy of the tree (each stamp about 0.3 µs,
the CPU asked with a ctypes call after the copy out: about 3), 256 B, load 4.8-5.5, p50 from
the sender's stamp, cumulative, two runs:

    the sender (in the child)
      send() to the watcher (the engine's Output.send)        7.2-7.4
      the ring written (write_plain)                         15.8-16.3
      the record written (os.write returned)                 24.1-26.3
      send() returned                                        28.7
      the worker parked (the runner's end, its loop)         35-37
    the host's worker
      out of epoll_wait                                      55-57
      the pipe read (receive, its lock, os.read)             62-63
      the slot copied (RingReader.latest's header and copy)  69-71
      published (Standins.publish)                           80-82
      the engine's lock taken, the update claimed            84/88
      its own gate opened (Parking.notify)                   89-91
      on_update starts (back through Parking.wait, _work,
        next_for_worker, the runner's start of an update)    98.5-103.5
      its read returns                                       101-104

The floor's reader, stamped the same way in the same minutes: out of its blocking read 33-39
µs after the stamp, the clone done 46-55. Its wake (write to awake) 26-29 µs; Mujou's 29-33:
the wake-ups cost the same, and the rest is CPU work on both sides, cold.

Where the woken worker runs: on the sender's CPU in 10-99 % of the messages, with the load
of the rest of the machine (a pipe's write is a sync wake-up, see above); then it waits for
the sender to park, 8-11 µs of the engine's Python after ``send()`` returns, and is awake
32-40 µs after the write, against 17-24 on the other CPU. An eventfd instead (no sync
wake-up), measured again in a bare probe (the sender busy 12 µs after its write, epoll with
EPOLLEXCLUSIVE, load 4.7-5.3, alternated): p50 15-26 µs through the pipe, 22-34 through the
eventfd, on the sender's CPU 93-95 % and 69-91 %: still not better.

Changed here: the sender's watcher writes a bare tensor through ``RingWriter.write_plain``
(watcher to ring written 13.0-14.1 -> 10.3-10.9 µs), and a ring's copy is published with
version 0, a tensor made for it (no torch call: copied to published 11.8-13.5 -> 9.1-9.8).
Tried and not kept: the plain write of a 64 KiB leaf in pieces of 16 KiB without the fences
(20-21 -> 21-24 µs: the copy's memory traffic costs, not the fences). ``bench/run.py --only
cross-process-256B,cross-process-64KiB --systems mujou,floor --repeats 2``, base and new
alternated twice, load 5-7: base 2.47x, 2.22x (256 B) and 2.12x, 2.16x (64 KiB); new 2.11x,
2.11x and 2.08x, 1.93x; with the plain write's ``copy_`` (NOTE [ the plain path ]) and
``--repeats 3``, base and new alternated at load 1.9-6.9: base 2.22x, 1.97x (256 B) and
2.37x, 1.97x (64 KiB); new 2.05x, 2.37x, 2.36x and 2.06x, 2.09x, 1.98x. At these loads the
bench cannot tell them apart (the stamps can); the target (1.5x) is not met.

What is left, by owner, at these loads: the wake 29-33 µs (the floor's 26-29); the process
layer's Python about 12 µs in the sender (the ring's write and the record, without the
write's syscall) and about 25 in the reader (receive, the copy, the publish, the arrival);
the engine's about 20 (``Output.send`` to its watcher 7, the claim 4, from the notify to
``on_update`` 10), and, when the reader shares the sender's CPU, the sender's 8-11 after its
send. 1.5x the floor (55-65 µs here) leaves 25-35 µs for all of it where it takes about 60:
no wake-up is left to remove, and each step costs 3-6 times its warm cost here.

Not the interpreter, though: a stand-alone copy of this layer's hot path (the plain write's
checks, the memmove, the header and the record; the pipe's read, the seqlock copy into a
spare and the publish) compiled with mypyc costs what it costs interpreted, warm (send 2.19-2.25
against 2.23-2.30 µs, receive 1.41 against 1.51-1.59) and cold (after a sleep of 1 ms and a
walk over 8 MB, within the noise of 19-35 and 9-15 µs). The cold time is in the C calls each
step makes through generic machinery, measured the same way one at a time: the eight torch
properties the plain write asked then 8.1 µs, one ``data_ptr()`` 3.5, a ctypes ``memmove`` of
256 B 8.7, three stores into the header's memoryview 3.3, an ``os.write`` 4.6, an empty
Python call 1.0 (warm: 0.64, 0.18, 0.70, 0.39, 0.76, 0.09). What would remove them is fewer
such calls, not compiling them: one C function per side that takes the tensor (its
``TensorImpl``: dtype, sizes, strides, data, through torch's C++ API, which needs an
extension built against torch) and does the checks, the copy, the header and the write, and
one that does the read, the copy and the header; or the engine's side, about a third of it.
Fewer calls in Python did pay once: the plain write copies with one ``copy_`` now instead of
two more properties, ``data_ptr`` and a ctypes ``memmove`` (NOTE [ the plain path ]: the
stamp to the record written 33.0 -> 24.5 µs, medians of five runs alternated).

Then (issue 24, helper hand, 2026-12-04 evening), on the quiet 16-core machine (the GPU
machine's CPUs, otherwise idle), where the bench had 105 µs against the floor's 44.3. A stamp
after each step in a copy of 942ff87 (about 0.3 µs a stamp), 256 B, two runs of 3 s, p50
from the sender's stamp, cumulative:

    the sender: the watcher entered 10.0-13.1, the ring written 20.1-26.7, the record
      written (os.write returned) 26.4-35.7
    the reader: out of epoll_wait 60.8-71.4, the pipe read 70.4-80.7, the slot copied
      84.3-93.8, published 94.7-103.4, the update claimed 108.2-116.8, the gate taken
      109.8-118.2, on_update 128.3-133.8, its read 133.9-138.9
    the floor, same minutes: its write returned 13.6-18.0, its reader out of os.read
      41.5-47.2, its clone done and read 61.7-79.4
    64 KiB: the ring written 21-28 µs after the watcher (the copy), 120-155 µs in all
      against the floor's 94-100

So the wake-up costs what the floor's does (34-36 µs from the write to the woken reader,
the floor's 23-34: each on an idle CPU of its own there), and every step of both processes
costs about 10 µs, run cold: there is no one step to remove. Counted per message on the path
(2-core machine; ``sys.setprofile`` from the reader's epoll return to ``on_update``, and
from the sender's stamp to its ``os.write``): the reader 22 Python calls and about 25 C
calls (9 of the Python calls in this module and ``_ring``, the rest the engine's: the claim,
``Parking.notify``, the worker's loop; ``Standins.publish``), the sender 7 and 6
(``Output.send``, the watcher, ``write_plain`` with its check and copy, ``Pipe.send``);
instructions with callgrind's collection switched on over the same regions (stamps
included): the reader 68,300-68,400 a message, the sender 30,400-31,400, of which the
interpreter's loop about 45 % and 39 %; the floor's, counted the same way (its reader from
before its blocking ``os.read`` to its clone done, its sender from its stamp to its write
returned): 14,200 and 10,000. Python opcodes on the same paths (``sys.settrace`` with
opcode events, per call): the reader about 960 a message, of which this layer's read of a
record 314 (``receive`` 50, ``_read`` 58, ``_publish`` 89, ``RingReader.latest`` 87,
``_copy_into`` 22, ``structured`` 8), ``Standins.publish`` 57, and the engine's about 550
(the runner's start of the update 209, ``Workers.claim`` 124, ``Policy.received_to_free``
82, ``Workers._answer`` 40, ``Parking.notify`` 29, three ``RealClock.now`` 51, ...); the
sender 358 (``Output.send`` 83, the watcher 51, ``write_plain`` 96 and ``_fits_plain`` 32,
``Pipe.send`` 44).

Changed: the plain write's record goes before its copy (NOTE [ the wake before the copy ] in
``_ring``): the copy runs while the reader wakes, and the sender's path to the wake byte is
21,400-21,900 instructions instead of 30,400-31,400 (callgrind as above). The reader waits
for a write it finds begun in 0.2 % of the messages (5-13 of about 3,170 a run; 81 in one
run at load 2), each settled within its patience, none left to the thread. Stamps on this
2-core machine (base and new alternated, p50 of 3 s runs, load 1.9-2.3), the record written:
256 B 30.7, 23.8, 26.4 -> 24.5, 22.8, 24.7 µs; 64 KiB 38.0, 28.8, 26.5 -> 24.6, 19.3, 19.4;
send to read: 256 B 117.4, 111.9, 102.2 -> 120.5, 108.5, 117.4; 64 KiB 131.2, 99.7, 90.3 ->
123.4, 94.8, 91.1. Here the woken reader runs on the sender's CPU (the other one busy; a
pipe's write is a sync wake-up, above), so it waits for the copy after the wake-up as it
waited for it before: the wake-up (write to the reader awake) grew by about as much as the
write came earlier (256 B: 33.1, 35.8, 29.3 -> 45.7, 38.3, 40.8 µs). Where the reader wakes
on an idle CPU of its own, as on the quiet machine, the copy is off the path: 10-14 µs
expected at 256 B, 20-28 at 64 KiB (the ring's write in the split above), which the lead's
run on that machine is to show; it was not measured there again (no device time left). The
bench here (``python -m bench._one mujou_processes cross_process '{"nbytes": 256,
"seconds": 2.0}'``, 942ff87 and this commit alternated with the floor, five rounds, load
1.9-2.6): 256 B 112.0, 106.5, 111.7, 109.8, 119.0 (median 111.7) -> 90.6, 103.7, 86.7,
112.1, 121.3 (103.7) µs, the floor 48.0, 57.4, 43.0, 53.5, 57.3 (53.5); 64 KiB 126.4, 134.0,
121.9, 119.4, 123.2 -> 129.3, 130.4, 109.2, 134.0, 138.6, the floor 59.6-75.9: within this
machine's noise.

Also the inbox's hot path in one function (``receive`` reads the pipe and publishes a read
of one known record itself; ``RingReader.structured`` an attribute): two Python calls fewer,
this layer's read of a record 314 -> 302 opcodes (``latest`` reads ``started`` too: 87 -> 99),
within the noise of the instructions counted (65,100-70,100 against 68,300-68,400). The
sender's path to the wake byte: 358 -> 306 opcodes (``write_plain`` 96 -> 55 before it calls
``wake``; the watcher's ``wake`` 17), its ``copy_`` after it.

What is left, at the quiet machine's figures: 1.5x the floor is 66 µs where Mujou takes about
95 once the copy is off the path. The rest is spread, about 10 µs a step: the sender's
``Output.send`` before its watcher (10-13 µs, the engine's), the plain write's check and the
record (about 10), the wake-up (the floor's), and the reader's 67 µs from its wake-up to
``on_update`` against the floor's 20-32 from its wake-up to its read: this layer's read, copy
and publish about 33, the engine's claim and the way back to the update about 34. What would
remove most of it is fewer distinct Python functions and C calls touched per message on both
sides (each step's cost is its cold caches, not its instructions): one C function per side
(the sender's check, copy, header and write; the reader's read, copy, publish and claim)
through torch's C++ API, or the engine's claim and start of the update folded into the
reader's call.

Then (issue 24, helper hand, 2026-12-04 late evening), counted with ``bench/handoff_callgrind.py``
(callgrind collecting in each side's region only, by client requests from a small C helper;
100 messages of 256 B, 20 ms apart, after 20 not counted; a woken reader waits 5 ms before its
region begins, so that the sender's copy, 50 times slower under valgrind and after its record,
is done, as it is natively in 99.8 % of the messages): the floor's reader, from its blocking
``os.read`` returned to its clone done, 11,150 instructions a message, its sender from the stamp
to its ``os.write`` 8,530; Mujou at 3fa933c, the reader from its worker's epoll returned to
``Input.read`` returned in ``on_update``, 67,480, the sender 15,200. Python opcodes on the
reader's path (``sys.settrace``): 1,217 a message, of which the way back from the claim to the
update (``Parking.notify`` and the gate's release, the gate's wait, ``Parking.wait``, the
worker's loop, ``next_for_worker``, ``_answer``, ``_wait_held``, two more clock reads) about 300.

Changed: the worker runs the update it claimed at once, inside its wait (``ListeningGate._run``,
the worker's batch runner), from the claim's time: ``Policy.received_to_free`` returns the batch
for that instead of holding it for the worker's loop (NOTE [ claiming a received update ] in the
engine's ``_policy``). The worker's wait then returns as notified, and its loop asks the policy
again, which puts the batch back as after any batch. The reader's region 67,480 -> 55,130
instructions (1,020 opcodes); alternated bench runs (base, this, the floor; load 3.8): 256 B
91.3/85.0/37.3, 96.1/85.3/39.0, 87.3/86.4/41.7 µs.

Then three costs off the reader's path: a fresh publish keeps the message it replaced until the
next wait (``Standins.drop_replaced``: freeing a tensor and its storage was about 3.9k
instructions on the path), the gate's own worker opens its gate without its mutex, and a
one-leaf ring's copy out without ``zip(strict=True)`` (its keyword parse alone about 1.5k):
the reader 55,130 -> 51,080 -> 47,170 instructions. And the two locks of the reader's path
(the pipe's, the engine's) and the sender's pipe lock taken with ``acquire``/``release``
instead of ``with`` (which looks up ``__enter__`` and ``__exit__`` and makes two bound methods:
about 900 instructions more a lock, counted in a loop under callgrind, 2,840 against 1,940):
the sender 15,200 -> 14,730.

What is left, counted (the reader at 47k against the floor's 11k, the sender at 14.7k against
8.5k): on the reader's side the engine's claim (``Workers.claim`` and ``received_to_free``,
about 200 opcodes), the runner's start of the update (about 210 opcodes before the hook, with
three torch calls for the per-thread settings), ``Input.read`` (57), and this layer's read, copy
and publish (about 400 opcodes: ``receive``, ``_publish``, ``RingReader.latest``,
``Standins.publish``, ``_arrived``); on the sender's, ``Output.send``'s and ``_fits_plain``'s
torch properties (``requires_grad``, ``is_cpu`` twice, ``_version``, ``dtype``, ``layout``,
``is_nested``, ``shape``: about 3k instructions) and the lock and write of the record. The
timings at load 5-8 on this machine cannot tell these apart (base, new and the floor alternated:
100.0/94.9/44.6, 96.6/95.8/44.0, 91.5/99.6/62.6, 107.0/105.9/66.9 µs at 256 B): the lead's
quiet machine is to show the ratio. What would meet 1.5x: about 20k instructions fewer a
message on both sides together, which this layer's Python no longer holds; a C function per
side (the plain write's checks, copy, header and record; the read, copy, publish and claim),
or the runner's per-update rules for a received update done once per batch.

Then (issue 24, helper hand2, 2026-12-04 night), measured first with ``bench/handoff_steps.py``.
Wake-ups (voluntary context switches of each thread over 2 s, from /proc, per message): the
host's worker 1.003, the sender's worker 1.001, every other thread of the two processes under
0.01; the floor's reader and sender 0.82 each. One block a side, as the floor: none to remove.
The steps, p50 from the sender's stamp, cumulative, 256 B, load 4-5: the record written
14.7-28.2 µs, the worker woken 45.8-50.6, published 57.9-66.4, the update claimed 63.3-74.2,
the hook 68.6-80.9, its read 70.7-83.8; the floor in the same minutes: its write 17.6, its
reader woken 38.7, its clone done 65.8 (the floor's own reader slows down as much at that
load). The reader woke on the sender's CPU for 11-96 % of the messages (the other CPU busy);
then the wake-up took 30-40 µs against 18-22 on the other CPU: a reader woken there waits for
the end of the sender's update, and the sender's worker parks 15-17 µs after its write (its
``send()`` returns after 7 of them: the ring's copy after the record, NOTE [ the wake before
the copy ]; the hook's end, the runner's and the worker's loop the rest). On a busy machine,
then, all of the sender's update counts, not only its path to the write; where the reader's
CPU is idle (a quiet machine) its 25-30 µs from the wake-up to the read, against the floor's
10, is the largest part. At load 2.6 (the reader on the sender's CPU for 1515 of 1911): the
whole 75.0 µs p50 there, 53.9 where it woke on the other CPU (its wake-up 32.0 against
13.2; the sender's worker parked 13.5 after its write); the floor's whole 53.7 in the same
minute, its reader on its sender's CPU for 1946 of 2000 (a sender that sleeps right after
its write costs a reader there nothing).

Changed: a record's output found with one lookup (``_Inbound.routes``, filled the first time
a read gets exactly one known record; ``_Output`` holds the ring's reader, the stand-in and the
number published, which were three lookups by name); a ring's bare copy published without
asking torch whether it is on the CPU (``Standins.publish_copy``); with one reader process, the
sender's wake is its pipe's ``send`` itself. Callgrind (``handoff_callgrind.py mujou 256
120``): the reader 43,636 -> 40,842 instructions, the sender 14,680 -> 14,368; opcodes on the
reader's path 989 -> 946. The bench at load 3-6 could not tell the two apart (256 B, base and
new alternated with the floor: base 79.5, 82.7, 88.0, 77.3; new 78.8, 61.9, 62.4, 63.4; the
floor 43.4, 45.3, 30.7, 37.5 µs).

What is left: the reader's 946 opcodes a message, this layer's about 420 (``receive`` 88,
``RingReader.latest`` 98 and ``_copy_into`` 19, ``_publish`` 52, ``Standins.publish_copy`` 50,
``_arrived`` 85, the gate's release and run 24) and the engine's about 530 (the runner up to
the hook 198, ``Workers.claim`` 124, ``received_to_free`` 79, ``Input.read`` 55,
``Parking.notify`` 29, the clock 17); the sender's 320 before its write (``Output.send`` 90,
``write_plain`` 109, ``_fits_plain`` 32 with five torch properties, ``Pipe.send`` 53, the
watcher 28). Folding ``_arrived``'s claim into ``receive`` was tried and dropped: the same
instructions (40,753 against 40,710). At about 0.65 µs per 1,000 instructions run cold here
(the reader's 26 µs for its 40k), 1.5x the floor (about 44 µs in a quiet minute, against
Mujou's 62) needs about 28,000 fewer instructions over the two sides: the reader's whole path
down to the floor's, which trimming this Python cannot reach. What would: one compiled call
per side for this layer (the pipe's read, the seqlock copy and the publish; the checks, the
header and the record), and the engine's claim and start of the update for a received
message in one call; on a busy machine, also less for the sender's worker to do after its
hook before it parks: with ``HANDOFF_END=park`` the harness counts the sender from its stamp
to its worker's wait at 47,013 instructions, 32,600 of them after its write, of which
torch's ``copy_`` of the 256 B into the slot 7,040. A ctypes ``memmove`` in its place (with
``is_contiguous`` and ``is_neg``), tried and dropped: 0.6 µs warm against ``copy_``'s 1.0-1.2,
but the same instructions on the path (the sender to its park 47,280 against 47,013: ctypes's
call costs about 5,000 itself), as NOTE [ the plain path ] in ``_ring`` found in time.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import struct
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from .._engine._arrivals import sent_arrived
from .._engine._update import batch_runner
from ._ring import SETTLE, RingReader
from ._wire import NO_HOLDER, Standins, joined, unpacked_rest

if TYPE_CHECKING:
    from .._engine import Engine
    from .._engine._batches import Batch
    from .._port import _Port
    from .._ports import Output

_FRAME = struct.Struct("!i")  # as _wire.Pipe frames a record: the length, then the bytes
_READ = 1 << 16  # bytes read from a pipe at once: many records
# Workers that wait on the pipes themselves: where epoll with EPOLLEXCLUSIVE and eventfd are.
LISTENING = hasattr(select, "EPOLLEXCLUSIVE") and hasattr(os, "eventfd")
_EXCLUSIVE = getattr(select, "EPOLLEXCLUSIVE", 0)
_LONGEST = 3600.0  # seconds: an epoll waits at most this at once (its limit is about 24 days)
_RECHECK = 0.001  # seconds between the thread's looks at a write whose record came before it finished


class _Output:
    """One output of a sender process, as this process takes its records: its ring's reader,
    its stand-in here, and the sender's number of its latest message published."""

    __slots__ = ("name", "published", "reader", "standin")

    def __init__(self, name: str, reader: RingReader, standin: Output[Any]) -> None:
        self.name = name
        self.reader = reader
        self.standin = standin
        self.published = 0


class _Inbound:
    """One sender process's wake pipe, as this process reads it (under ``lock``)."""

    __slots__ = ("buffer", "closed", "connection", "fd", "lock", "outputs", "routes")

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.fd = connection.fileno()
        os.set_blocking(self.fd, False)
        self.lock = threading.Lock()
        self.buffer = b""  # bytes of a frame not complete yet
        self.closed = False
        self.outputs: dict[str, _Output] = {}  # this sender's outputs with a ring, by name
        # A framed record of one of them: the output. One read that gets exactly such a record
        # (the hot path: one message since the last look) is taken with one lookup here.
        self.routes: dict[bytes, _Output] = {}


class Inbox:
    """The wake pipes from the other processes, the workers' listening gates and the thread
    that waits on the pipes while no worker does.

    Anything that goes wrong taking a record (an ``OSError`` fetching a ring's descriptor, out
    of descriptors) is this process's, not the sender's: it stops the run with
    ``MujouInternalError``, as in the engine's own threads, and that pipe is read no more.
    """

    def __init__(self, engine: Engine, standins: Standins, connections: Sequence[Connection]) -> None:
        self.engine = engine
        self.standins = standins
        self._inbound = {inbound.fd: inbound for inbound in map(_Inbound, connections)}
        self._names: dict[bytes, str] = {}  # a record's bytes: its output's name
        self._framed: dict[bytes, str] = {}  # the same, framed: what one read of one record gets
        self._stopped = False
        self._polls_lock = threading.Lock()  # the epolls' registrations change under it
        self._polls: list[select.epoll] = []  # every epoll the pipes are in, but gates closed
        self._gates: list[ListeningGate] = []
        self._wake = -1  # the thread's eventfd (LISTENING), written to make it look again
        # Outputs whose newest write had begun and not finished when a record of it was taken
        # (NOTE [ the wake before the copy ] in _ring): the thread looks at them again.
        self._unsettled: set[tuple[_Inbound, _Output]] = set()
        self._thread = threading.Thread(target=self._main, name="mujou-ports-in", daemon=True)

    def start(self) -> None:
        """The workers wait on the pipes from now on (where they can), then the thread."""
        self._listen()
        self._thread.start()

    def _listen(self) -> None:
        """The workers park on listening gates, registered on the pipes before the thread."""
        engine = self.engine
        if LISTENING and engine.workers > 0:
            self._gates = [ListeningGate(self, w) for w in range(engine.workers)]
            with self._polls_lock:
                for gate in self._gates:  # the workers' first: EPOLLEXCLUSIVE wakes them first
                    self._register(gate.poll)
            with engine.lock:
                engine.parking.use_gates(self._gates)

    def stop(self) -> None:
        """Publish nothing more (the pipes are still read, to their ends)."""
        self._stopped = True

    def close(self, timeout: float) -> None:
        """Publish nothing more; the workers park on plain locks again; wait up to ``timeout``
        seconds for the thread to end (it ends, closing the pipes and dropping their rings,
        once each sender's end closed)."""
        self._stopped = True
        if self._gates:
            engine = self.engine
            with engine.lock:
                engine.parking.use_gates(None)
            with self._polls_lock:
                for gate in self._gates:
                    self._polls.remove(gate.poll)
                    gate.close()
            self._gates = []
        thread = self._thread
        if thread.ident is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # -- taking records -----------------------------------------------------------------------

    def receive(self, fd: int, worker: int | None) -> tuple[Batch, float] | None:
        """Take what pipe ``fd`` holds now: publish each output's newest slot, then wake the
        readers they trigger, with ``worker`` (the caller, parked) preferred. Never blocks.

        Returns the update ``worker`` claimed (NOTE [ claiming a received update ] in the
        engine's ``_policy``): its batch and its start, which the caller runs at once; None
        where it claimed none."""
        inbound = self._inbound.get(fd)
        if inbound is None:
            return None
        claimed = None
        lock = inbound.lock
        try:
            lock.acquire()  # not ``with``: about 900 instructions fewer a message
            try:
                if inbound.closed:
                    return None
                try:
                    chunk = os.read(fd, _READ)
                except BlockingIOError:
                    return None  # another reader took what there was
                # The hot path: the read took the pipe's one record, of an output seen before
                # (NOTE [ the hand-off between processes ]): one lookup, one publish.
                output = None if inbound.buffer or self._stopped else inbound.routes.get(chunk)
                if output is not None:
                    port = self._publish(inbound, output)
                    woken: Sequence[_Port] = (port,) if port is not None and port._wakes else ()
                else:
                    woken = []
                    self._read(inbound, chunk, woken)
            finally:
                lock.release()
            if woken:
                claimed = self._arrived(woken, worker)
            if worker is not None and self._unsettled:
                self._tell_thread()  # to look at a write it found begun, later
        except BaseException as exc:
            self._close(inbound)
            if not self._stopped and not self.engine.ended:
                self.engine.crashed(NO_HOLDER, exc, exits=False)
        return claimed

    def prepare(self) -> None:
        """On a thread about to wait: make the tensors of each ring's next message now
        (``RingReader.prepare``), so that taking a record copies into them, and free the
        message a publish replaced (``Standins.drop_replaced``). A pipe another thread reads
        now is left to the next wait."""
        self.standins.drop_replaced()
        for inbound in self._inbound.values():
            if inbound.closed or not inbound.outputs or not inbound.lock.acquire(blocking=False):
                continue
            try:
                for output in inbound.outputs.values():
                    output.reader.prepare()
            finally:
                inbound.lock.release()

    def _read(self, inbound: _Inbound, chunk: bytes, woken: list[_Port]) -> None:
        """With ``inbound.lock`` held: take the records of ``chunk``, just read from the pipe,
        and of what the pipe holds after it, until it is empty."""
        fd = inbound.fd
        names: dict[str, None] = {}  # the outputs to publish, once each: the newest slot
        while True:
            if not chunk:  # the sender's process closed its end: it stopped, or died
                self._publish_all(inbound, names, woken)
                self._close_locked(inbound)
                return
            name = None if inbound.buffer or self._stopped else self._framed.get(chunk)
            if name is not None:  # whole records, one seen before
                names[name] = None
                output = inbound.outputs.get(name)
                if output is not None and len(chunk) < _READ:  # exactly one: the next such read
                    inbound.routes[chunk] = output  # takes the hot path
            else:
                data = inbound.buffer + chunk if inbound.buffer else chunk
                at, end = 0, len(data)
                while end - at >= _FRAME.size:
                    (length,) = _FRAME.unpack_from(data, at)
                    if end - at - _FRAME.size < length:
                        break
                    record = data[at + _FRAME.size : at + _FRAME.size + length]
                    at += _FRAME.size + length
                    if self._stopped:
                        continue  # not unpickled: an announcement would fetch a descriptor
                    name = self._names.get(record)
                    if name is not None:
                        names[name] = None
                        continue
                    self._record(inbound, record, names)
                inbound.buffer = data[at:]
            if len(chunk) < _READ:
                break
            try:
                chunk = os.read(fd, _READ)
            except BlockingIOError:
                break
        self._publish_all(inbound, names, woken)

    def _record(self, inbound: _Inbound, record: bytes, names: dict[str, None]) -> None:
        """A record not seen before: an announcement of a new ring, or a first record of an
        output (kept by its bytes: every later one is the same)."""
        try:
            unpickled = pickle.loads(record)
        except EOFError:  # an announcement whose descriptor its sender took back
            return  # it closed this pipe (its part of the run ended): its end comes next
        if unpickled[0] == "announce":
            _, name, announce = unpickled
            output = inbound.outputs.get(name)
            if output is None:
                inbound.outputs[name] = _Output(name, RingReader(announce), self.standins.ports[name])
            else:
                output.reader.reannounce(announce)
            return
        (name,) = unpickled
        self._names[record] = name
        self._framed[_FRAME.pack(len(record)) + record] = name
        names[name] = None

    def _publish_all(self, inbound: _Inbound, names: dict[str, None], woken: list[_Port]) -> None:
        """Publish the newest slot of each of ``names``, unless it is out already (or its ring
        never came: its sender took the announcement's descriptor back as it ended)."""
        for name in names:
            output = inbound.outputs.get(name)
            if output is None:
                continue  # its ring never came
            port = self._publish(inbound, output)
            if port is not None and port._wakes:
                woken.append(port)

    def _publish(self, inbound: _Inbound, output: _Output, patience: float = SETTLE) -> _Port | None:
        """Publish the newest slot of ``output``; its stand-in, or None where nothing was
        published. A write of it begun and not done after ``patience`` seconds is looked at
        again later (``_unsettled``)."""
        reader = output.reader
        got = reader.latest(patience)
        if reader.unsettled:
            self._unsettle(inbound, output)
        if got is None:
            return None
        number, stamp, tensors = got
        if number <= output.published:
            return None  # published already, by an earlier record that found it newest
        output.published = number
        if self.engine.ended or self._stopped:
            return None
        # A ring's copy, made for this message and changed by no one (no torch call for it on
        # the reader's path).
        if not reader.structured:
            return self.standins.publish_copy(output.standin, output.name, tensors[0], stamp, number)
        rest = unpacked_rest(tensors.pop())
        message, nest = joined(tensors, rest)
        return self.standins.publish(None, output.name, message, nest, stamp=stamp, number=number, fresh=True)

    def _unsettle(self, inbound: _Inbound, output: _Output) -> None:
        """``output``'s newest write had begun and not finished (NOTE [ the wake before
        the copy ] in ``_ring``): its writer sends its records again once done, as the reader
        asked, but may miss that request by a hair, so the thread also looks at it every
        ``_RECHECK`` seconds until it is published. A worker that took the record wakes the
        thread for it (``receive``); the thread itself looks before it waits again, so it
        never wakes itself: no busy loop while a writer stays stopped."""
        with self._polls_lock:
            self._unsettled.add((inbound, output))

    def _tell_thread(self) -> None:
        """Make the thread look again now (at ``_unsettled``, at its pipes)."""
        with self._polls_lock:
            if self._wake >= 0:
                os.eventfd_write(self._wake, 1)

    def _recheck(self) -> None:
        """The thread: publish what ``_unsettle`` left, where its write is done now (without
        waiting for it), and wake the readers it triggers."""
        with self._polls_lock:
            unsettled = list(self._unsettled)
            self._unsettled.clear()
        for inbound, output in unsettled:
            try:
                with inbound.lock:
                    if inbound.closed:
                        continue
                    port = self._publish(inbound, output, 0.0)
                if port is not None and port._wakes:
                    self._arrived((port,), None)
            except BaseException as exc:
                self._close(inbound)
                if not self._stopped and not self.engine.ended:
                    self.engine.crashed(NO_HOLDER, exc, exits=False)

    def _arrived(self, woken: Sequence[_Port], worker: int | None) -> tuple[Batch, float] | None:
        """The messages just published arrive (trigger.real-time); the readers they trigger
        are due at once, and the parked ``worker`` that took them is the one woken first, or
        claims the update (returned: its batch and its start, for it to run at once)."""
        engine = self.engine
        lock = engine.lock
        lock.acquire()  # not ``with``, as in receive
        try:
            policy = engine.policy
            now = engine.clock.now()
            claimed = None
            if worker is not None:
                # One reader woken: the worker claims its update (NOTE [ claiming a received
                # update ] in the engine's _policy), parked no more; else it is the parked
                # worker woken first.
                wakes = woken[0]._wakes if len(woken) == 1 else ()
                if len(wakes) == 1:
                    claimed = policy.received_to_free(policy.slots[wakes[0]], now, worker)
                if claimed is not None:
                    engine.parking.notify(worker)
                else:
                    engine.parking.prefer(worker)
            if claimed is None:
                for port in woken:
                    sent_arrived(policy, port, now, None)
            if policy.wake:
                engine.deliver()
        finally:
            lock.release()
        return None if claimed is None else (claimed, now)

    # -- the pipes' ends -----------------------------------------------------------------------

    def _register(self, poll: select.epoll) -> None:
        """With ``_polls_lock`` held: ``poll`` waits on every pipe still open."""
        for fd, inbound in self._inbound.items():
            if not inbound.closed:
                poll.register(fd, select.EPOLLIN | _EXCLUSIVE)
        self._polls.append(poll)

    def _close(self, inbound: _Inbound) -> None:
        with inbound.lock:
            self._close_locked(inbound)

    def _close_locked(self, inbound: _Inbound) -> None:
        """With ``inbound.lock`` held: read the pipe no more, drop its rings, close its end;
        the thread looks again (it ends once every pipe is closed)."""
        if inbound.closed:
            return
        inbound.closed = True
        with self._polls_lock:
            for poll in self._polls:
                with contextlib.suppress(OSError, ValueError):  # not in it: no epoll here
                    poll.unregister(inbound.fd)
        for output in inbound.outputs.values():
            output.reader.close()
        inbound.outputs.clear()
        inbound.routes.clear()
        inbound.connection.close()
        self._tell_thread()

    def _open(self) -> list[_Inbound]:
        return [inbound for inbound in self._inbound.values() if not inbound.closed]

    def _main(self) -> None:
        """The thread: take the records while no worker does, until every pipe is closed."""
        try:
            if LISTENING:
                self._main_epoll()
            else:  # pragma: no cover (Linux in CI): one pipe at a time, as they come
                self._main_poll()
        except BaseException as exc:
            if not self._stopped and not self.engine.ended:
                self.engine.crashed(NO_HOLDER, exc, exits=False)
        finally:
            for inbound in self._inbound.values():
                self._close(inbound)

    def _main_epoll(self) -> None:
        poll = select.epoll()
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            poll.register(self._wake, select.EPOLLIN)
            with self._polls_lock:
                self._register(poll)  # after the workers': woken only when no worker waits
            while self._open():
                self.prepare()
                for fd, _ in poll.poll(_RECHECK if self._unsettled else -1):
                    if fd == self._wake:
                        with contextlib.suppress(BlockingIOError):
                            os.eventfd_read(self._wake)
                    else:
                        self.receive(fd, None)
                if self._unsettled:
                    self._recheck()
        finally:
            with self._polls_lock:
                self._polls.remove(poll)
                wake, self._wake = self._wake, -1
            poll.close()
            os.close(wake)

    def _main_poll(self) -> None:  # pragma: no cover (Linux in CI)
        poll = select.poll()
        for fd in self._inbound:
            poll.register(fd, select.POLLIN)
        while self._open():
            for fd, _ in poll.poll(100):  # ms: a pipe closed by another thread is seen
                self.receive(fd, None)
                if self._inbound[fd].closed:
                    poll.unregister(fd)
            if self._unsettled:
                self._recheck()


class ListeningGate:
    """Worker ``worker``'s gate in ``Parking`` while it may take the inbound records: as a
    lock held while nobody opened it, but a wait on it also takes the records that come
    meanwhile (``Inbox.receive``), and the update one triggers opens it (``prefer``)."""

    __slots__ = (
        "_closed",
        "_event",
        "_inbox",
        "_mutex",
        "_open",
        "_runner",
        "_signalled",
        "_waiter",
        "_worker",
        "poll",
    )

    def __init__(self, inbox: Inbox, worker: int) -> None:
        self._inbox = inbox
        self._worker = worker
        self._event = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)  # written by release
        self.poll = select.epoll()
        self.poll.register(self._event, select.EPOLLIN)
        self._mutex = threading.Lock()
        self._open = False  # released, not acquired since
        self._signalled = False  # the eventfd was written since it was last read
        self._waiter = 0  # the ident of the thread that waits in acquire now (0: none)
        self._closed = False
        self._runner: Callable[[Batch, float], float] | None = None  # its worker's, made once

    def release(self) -> None:
        """Open the gate. Its own worker, releasing it as a record it took wakes it
        (``Inbox._arrived``), only marks it open, without the mutex: it looks before it waits
        again, and the other threads only ever open it too (``_waiter``, its own ident, is set
        and cleared by that thread alone)."""
        if self._waiter == threading.get_ident():
            self._open = True
            return
        with self._mutex:
            self._open = True
            if not self._closed and not self._signalled:
                self._signalled = True
                os.eventfd_write(self._event, 1)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Wait until released (True) or ``timeout`` seconds passed (False; -1: no limit),
        taking the inbound records meanwhile. A closed gate waits no more: ``Parking`` gives
        its worker a plain lock for its next wait."""
        with self._mutex:
            if self._taken():
                return True
            if not blocking or self._shut():
                return False
            self._waiter = threading.get_ident()
        self._inbox.prepare()
        deadline = None if timeout < 0 else time.monotonic() + timeout
        receive, event, poll = self._inbox.receive, self._event, self.poll
        try:
            while True:
                left = -1.0 if deadline is None else min(max(0.0, deadline - time.monotonic()), _LONGEST)
                for fd, _ in poll.poll(left):
                    if fd != event:
                        claimed = receive(fd, self._worker)
                        if claimed is not None:  # notified: the gate is open
                            self._run(*claimed)
                with self._mutex:
                    if self._taken():
                        return True
                    if self._closed or (deadline is not None and time.monotonic() >= deadline):
                        return False
        finally:
            with self._mutex:
                self._waiter = 0
                if self._closed:
                    self._close_fds()

    def _run(self, batch: Batch, start: float) -> None:
        """Run the update the worker claimed as it took a record, at once, on its way out of
        the wait: what its loop would do with the RUN answer (NOTE [ claiming a received
        update ] in the engine's ``_policy``). It asks the policy again once the wait
        returns; an error of Mujou's own goes up to the worker's loop, as from there."""
        run = self._runner
        if run is None:
            run = self._runner = batch_runner(self._inbox.engine, self._worker)
        busy = run(batch, start)
        self._inbox.engine.worker_busy[self._worker] += busy

    def _shut(self) -> bool:
        """Whether the gate was closed (a method: it changes while the worker waits)."""
        return self._closed

    def _taken(self) -> bool:
        """With ``_mutex`` held: whether the gate was open; if so it is taken, its eventfd
        read back to zero."""
        if not self._open:
            return False
        self._open = False
        if self._signalled and not self._closed:
            self._signalled = False
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self._event)
        return True

    def close(self) -> None:
        """Wait on nothing more; the descriptors close now, or as its worker leaves a wait."""
        with self._mutex:
            self._closed = True
            if self._waiter:
                os.eventfd_write(self._event, 1)  # to leave the wait
            else:
                self._close_fds()

    def _close_fds(self) -> None:
        if self._event >= 0:
            self.poll.close()
            os.close(self._event)
            self._event = -1
