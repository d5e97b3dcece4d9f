"""The net of conformance/test_replay.py: a camera, a triggered detector and a periodic sink.

At the top level of a module on ``sys.path``, so that the processes of a run (started with
``spawn``) import them by name. Every node keeps what it read (value, ``fresh``, ``stamp``) and
its ``dt`` in its state, so that comparing state trees compares every read.
"""

from __future__ import annotations

import torch

from mujou import Input, Net, Node, Output, TensorSpec, on


class Camera(Node):
    """Periodic: a first frame in on_start, then frames drawn from its generator; every hook
    call is noted in ``calls`` (a replaced camera's stays empty)."""

    frame = Output(spec=TensorSpec(torch.float32, (2,)))
    poke = Input(optional=True)  # what wakes it when it is ``triggered`` only

    def __init__(self, period: float = 0.01, seed: int = 7, *, triggered: bool = False) -> None:
        if triggered:
            super().__init__(period=None, trigger=on("poke"), seed=seed)
        else:
            super().__init__(period=period, seed=seed)
        self.calls: list[str] = []

    def on_start(self) -> None:
        self.calls.append("on_start")
        self.frame.send(torch.full((2,), -1.0))

    def on_update(self, dt: float) -> None:
        self.calls.append("on_update")
        self.frame.send(torch.rand(2, generator=self.generator))

    def on_stop(self) -> None:
        self.calls.append("on_stop")


class Detector(Node):
    """Triggered by each frame: keeps what it read, sends it scaled with a draw of its own."""

    frame = Input()
    boxes = Output()

    def __init__(self, seed: int | None = 8) -> None:
        super().__init__(trigger=on("frame"), seed=seed)
        self.seen: list[float] = []

    def on_update(self, dt: float) -> None:
        frame = self.frame.read()
        stamp = self.frame.stamp
        self.seen += [dt, float(self.frame.fresh), -1.0 if stamp is None else stamp]
        self.seen += [] if frame is None else frame.tolist()
        draw = torch.rand((), generator=self.generator)
        self.boxes.send((torch.zeros(2) if frame is None else frame) * 2 + draw)


class Sink(Node):
    """Periodic, at another period: keeps what it read and a running sum."""

    boxes = Input()

    def __init__(self, period: float = 0.015) -> None:
        super().__init__(period=period, seed=9)
        self.seen: list[float] = []
        self.total = torch.zeros(2)

    def on_update(self, dt: float) -> None:
        boxes = self.boxes.read()
        stamp = self.boxes.stamp
        self.seen += [dt, float(self.boxes.fresh), -1.0 if stamp is None else stamp]
        if boxes is not None:
            self.total = self.total + boxes


class Pipeline(Net):
    """camera -> detector -> sink (``camera``: another camera than ``Camera()``;
    ``detector_seed``: None, a detector seeded by the run)."""

    def __init__(self, camera: Camera | None = None, detector_seed: int | None = 8) -> None:
        super().__init__()
        self.camera = Camera() if camera is None else camera
        self.detector = Detector(seed=detector_seed)
        self.sink = Sink()
        self.connect(self.camera.frame, self.detector.frame)
        self.connect(self.detector.boxes, self.sink.boxes)


class Greeter(Node):
    """Periodic: two messages in on_start, then its count plus what the host wrote on ``x``
    (recording with processes: conformance/test_record.py)."""

    x = Input(optional=True)
    out = Output()

    def __init__(self) -> None:
        super().__init__(period=0.25, seed=0)
        self.count = 0

    def on_start(self) -> None:
        self.out.send(torch.tensor(-1.0))
        self.out.send(torch.tensor(-2.0))

    def on_update(self, dt: float) -> None:
        self.count += 1
        written = self.x.read()
        self.out.send(torch.tensor(float(self.count)) + (0.0 if written is None else written))
