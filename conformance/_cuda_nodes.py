"""The net of conformance/test_cuda_crossing.py: CUDA messages that leave their process.

At the top level of a module on ``sys.path``, so that the processes of a run (started with
``spawn``) and the agents of local "hosts" import them by name. Every node keeps in its state
what it read and on which device it found it, so that comparing state trees compares every
read and every device rule.
"""

from __future__ import annotations

import torch

from mujou import Input, Net, Node, Output, TensorSpec, on


class GpuCamera(Node):
    """Periodic: frames drawn from its generator on its own device."""

    frame = Output(spec=TensorSpec(torch.float32, (4,)))

    def __init__(self, device: str = "cuda", period: float = 0.01, seed: int = 3) -> None:
        super().__init__(period=period, seed=seed, device=device)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        self.frame.send(torch.rand(4, generator=self.generator, device=self.device))


class Follower(Node):
    """Triggered by each frame: mixes it into an accumulator on its own device and counts the
    messages that came on another device than its own (which must stay 0)."""

    frame = Input()
    out = Output()

    def __init__(self, device: str, seed: int = 5) -> None:
        super().__init__(trigger=on("frame"), seed=seed, device=device)
        self.acc = torch.zeros(4, device=device)
        self.stamps: list[float] = []
        self.off_device = 0

    def on_update(self, dt: float) -> None:
        frame = self.frame.read()
        assert frame is not None  # triggered by it
        if frame.device != self.device:
            self.off_device += 1
        stamp = self.frame.stamp
        self.stamps.append(-1.0 if stamp is None else stamp)
        noise = torch.rand(4, generator=self.generator, device=self.device)
        self.acc = 0.5 * self.acc + frame.to(self.device) + 0.1 * noise
        self.out.send(self.acc)


class CudaPipeline(Net):
    """A CUDA camera read by a CUDA follower and a CPU follower; a CUDA node reads the CPU one.
    (``gpu``: the device of the CUDA nodes; "cpu" checks the tests' own logic where no GPU is.)"""

    def __init__(self, gpu: str = "cuda") -> None:
        super().__init__()
        self.camera = GpuCamera(gpu)
        self.gpu = Follower(gpu)
        self.cpu = Follower("cpu", seed=6)
        self.back = Follower(gpu, seed=9)
        self.connect(self.camera.frame, self.gpu.frame)
        self.connect(self.camera.frame, self.cpu.frame)
        self.connect(self.cpu.out, self.back.frame)
