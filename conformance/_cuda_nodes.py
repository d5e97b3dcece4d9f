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


class LaneCamera(Node):
    """Periodic: a frame from its generator on its own device, sent bare and, in a nest, with
    its number (so a reader that skipped frames knows which one it read)."""

    frame = Output()
    numbered: Output[dict[str, object]] = Output()

    def __init__(self, device: str = "cuda", period: float = 0.01, seed: int = 3) -> None:
        super().__init__(period=period, seed=seed, device=device)
        self.count = 0

    def on_update(self, dt: float) -> None:
        self.count += 1
        frame = torch.rand(4, generator=self.generator, device=self.device)
        self.frame.send(frame)
        self.numbered.send({"frame": frame * 2.0, "n": self.count})


class LaneReader(Node):
    """Triggered by the numbered frames: keeps each one's number and bits (as floats, exact for
    float32), the bare frame's bits, and how many came on another device than its own."""

    numbered: Input[dict[str, object]] = Input()
    frame = Input()
    seen_count = Output()

    def __init__(self, device: str = "cuda") -> None:
        super().__init__(trigger=on("numbered"), seed=1, device=device)
        self.seen: list[tuple[int, list[float]]] = []
        self.bare: list[list[float]] = []
        self.off_device = 0

    def on_update(self, dt: float) -> None:
        numbered = self.numbered.read()
        assert numbered is not None  # triggered by it
        frame, n = numbered["frame"], numbered["n"]
        assert isinstance(frame, torch.Tensor) and isinstance(n, int)
        bare = self.frame.read()
        for tensor in (frame, bare):
            if tensor is not None and tensor.device != self.device:
                self.off_device += 1
        self.seen.append((n, frame.cpu().tolist()))
        if bare is not None:
            self.bare.append(bare.cpu().tolist())
        self.seen_count.send(torch.tensor(len(self.seen)))


class LanePair(Net):
    """A CUDA camera and a CUDA reader of its bare and numbered frames (``gpu``: their device)."""

    def __init__(self, gpu: str = "cuda") -> None:
        super().__init__()
        self.camera = LaneCamera(gpu)
        self.reader = LaneReader(gpu)
        self.connect(self.camera.frame, self.reader.frame)
        self.connect(self.camera.numbered, self.reader.numbered)
