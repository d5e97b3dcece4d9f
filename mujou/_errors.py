"""Mujou's exceptions and warnings."""

from __future__ import annotations


class HookError(RuntimeError):
    """A hook of a node raised: the run stopped, and this names where.

    The original exception is the ``__cause__``. See :ref:`run.hook-error`.

    Attributes:
        node: The node's name (its dotted path in the net).
        hook: The hook that raised, e.g. ``"on_update"``.
        time: The run's timer time when the hook started, in seconds.
    """

    def __init__(self, node: str, hook: str, time: float, exc: BaseException) -> None:
        super().__init__(f"node {node!r} raised {type(exc).__name__} in {hook} at t={time:.3f}: {_text(exc)}")
        self.node = node
        self.hook = hook
        self.time = time


def _text(exc: BaseException) -> str:
    """``str(exc)``, or what stands for it when the exception's own ``__str__`` raises."""
    try:
        return str(exc)
    except Exception as error:
        return f"<str() of the exception raised {type(error).__name__}>"


class StateFileError(ValueError):
    """A file that :func:`mujou.load` cannot read as a state tree, and why.

    The file is empty, truncated, not one ``torch.save`` writes, damaged (its content does not
    match the checksum ``mujou.save`` wrote), holds objects a state file may not hold, or holds
    no tree. A ``ValueError``, so that ``except ValueError`` still catches it; its own class lets
    a resume fall back to an older checkpoint without catching other errors. The cause, when
    there is one, is the ``__cause__``. See :ref:`state.load-errors`.

    Attributes:
        path: The file, as given to ``mujou.load``.
        reason: What is wrong with it.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot load the state file {path!r}: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self) -> tuple[type[StateFileError], tuple[str, str]]:
        return (type(self), (self.path, self.reason))


class MujouInternalError(Exception):
    """A broken invariant inside Mujou: a bug in Mujou, not in the net. Please file it."""


class MujouWarning(UserWarning):
    """Base class of the warnings Mujou issues."""


class OversubscriptionWarning(MujouWarning):
    """More compute threads than physical cores: see :ref:`settings.oversubscription-warning`."""


class LeakedSettingWarning(MujouWarning):
    """A hook returned with a per-thread torch setting changed: see :ref:`rules.hook-settings-warning`."""


class GlobalRandomWarning(MujouWarning):
    """A hook reseeded torch's global generator: see :ref:`rules.manual-seed-warning`."""


class UnsavedAttributeWarning(MujouWarning):
    """A node attribute the default ``state_dict`` cannot keep: see :ref:`state.unsaved-warning`."""


class TruncatedRecordingWarning(MujouWarning):
    """A recording the run did not close, read up to its last whole chunk: see :ref:`record.read-cut`."""


class RecordingVersionWarning(MujouWarning):
    """A recording another Mujou version wrote: see :ref:`record.read-version`."""


class ProcessError(RuntimeError):
    """A process of a run ended unexpectedly, or had to be killed: the run stopped. See :ref:`proc.died`.

    Attributes:
        process: The name the process has in ``processes=``.
        exitcode: Its exit code (negative: the signal that ended it), or None if unknown.
        nodes: The names of its nodes.
        stopped: Whether its nodes had their ``on_stop`` before it ended.
    """

    def __init__(
        self,
        process: str,
        exitcode: int | None,
        nodes: tuple[str, ...],
        stopped: bool = False,
        reason: str | None = None,
    ) -> None:
        how = "with an unknown exit code" if exitcode is None else _exit_text(exitcode)
        what = f"ended unexpectedly ({how})" if reason is None else f"{reason} ({how})"
        shown = ", ".join(map(repr, nodes))
        nodes_text = "had their on_stop before" if stopped else "stopped without on_stop"
        super().__init__(
            f"process {process!r} of the run {what}; its nodes {shown} {nodes_text}, and the run stopped"
        )
        self.process = process
        self.exitcode = exitcode
        self.nodes = nodes
        self.stopped = stopped
        self._reason = reason

    def __reduce__(
        self,
    ) -> tuple[type[ProcessError], tuple[str, int | None, tuple[str, ...], bool, str | None]]:
        return (type(self), (self.process, self.exitcode, self.nodes, self.stopped, self._reason))


def _exit_text(exitcode: int) -> str:
    if exitcode < 0:
        import signal

        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"killed by {name}"
    return f"exit code {exitcode}"
