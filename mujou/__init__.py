"""Mujou: nets of PyTorch nodes that update asynchronously, each at its own period.

The public API is exactly what ``__all__`` lists; every other module is private.
"""

from ._containers import NodeDict as NodeDict
from ._containers import NodeList as NodeList
from ._errors import GlobalRandomWarning as GlobalRandomWarning
from ._errors import HookError as HookError
from ._errors import HookNameWarning as HookNameWarning
from ._errors import LeakedSettingWarning as LeakedSettingWarning
from ._errors import MujouInternalError as MujouInternalError
from ._errors import MujouWarning as MujouWarning
from ._errors import OversubscriptionWarning as OversubscriptionWarning
from ._errors import ProcessError as ProcessError
from ._errors import RecordingVersionWarning as RecordingVersionWarning
from ._errors import StateFileError as StateFileError
from ._errors import TruncatedRecordingWarning as TruncatedRecordingWarning
from ._errors import UnsavedAttributeWarning as UnsavedAttributeWarning
from ._hosts._ray import OnRay as OnRay
from ._hosts._remote import HostError as HostError
from ._hosts._remote import OnHost as OnHost
from ._hosts._torchrun import serve_ranks as serve_ranks
from ._net import Net as Net
from ._node import Node as Node
from ._ports import Input as Input
from ._ports import Output as Output
from ._record._reader import RecordedMessage as RecordedMessage
from ._record._reader import RecordedPort as RecordedPort
from ._record._reader import Recording as Recording
from ._record._recorder import Recorder as Recorder
from ._record._replay import Replay as Replay
from ._run import Run as Run
from ._specs import TensorSpec as TensorSpec
from ._start import run as run
from ._state import load as load
from ._state import save as save
from ._stats import HostStats as HostStats
from ._stats import NodeStats as NodeStats
from ._stats import RunStats as RunStats
from ._subscription import Subscription as Subscription
from ._timer import RealTimeTimer as RealTimeTimer
from ._timer import Timer as Timer
from ._timer import VirtualTimer as VirtualTimer
from ._trace_view import plot_trace as plot_trace
from ._trigger import Trigger as Trigger
from ._trigger import on as on
from ._trigger import on_all as on_all
from ._version import __version__ as __version__

__all__ = [
    "GlobalRandomWarning",
    "HookError",
    "HookNameWarning",
    "HostError",
    "HostStats",
    "Input",
    "LeakedSettingWarning",
    "MujouInternalError",
    "MujouWarning",
    "Net",
    "Node",
    "NodeDict",
    "NodeList",
    "NodeStats",
    "OnHost",
    "OnRay",
    "Output",
    "OversubscriptionWarning",
    "ProcessError",
    "RealTimeTimer",
    "RecordedMessage",
    "RecordedPort",
    "Recorder",
    "Recording",
    "RecordingVersionWarning",
    "Replay",
    "Run",
    "RunStats",
    "StateFileError",
    "Subscription",
    "TensorSpec",
    "Timer",
    "Trigger",
    "TruncatedRecordingWarning",
    "UnsavedAttributeWarning",
    "VirtualTimer",
    "load",
    "on",
    "on_all",
    "plot_trace",
    "run",
    "save",
    "serve_ranks",
]


def _fix_module_metadata() -> None:
    """Show the public objects as ``mujou.X`` in tracebacks, pickles and docs (as trio does)."""
    for name in __all__:
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith("mujou."):
            obj.__module__ = "mujou"


_fix_module_metadata()
del _fix_module_metadata
