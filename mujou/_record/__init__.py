"""Recording a run to an MCAP file, reading it back, and replaying it (``mujou[record]``).

Nothing here is imported by ``import mujou``; the modules that need ``mcap`` import it when a
recording is made or opened. See :ref:`record-and-replay`.
"""
