"""The systems Mujou is measured against, each doing the same work as Mujou's workloads.

Every module here has the same four entry points as :mod:`bench.mujou_system`: ``fleet``,
``dispatch``, ``echo`` and ``idle``; each returns a :class:`bench._common.Metrics`.
"""
