"""Unit tests of the nodes of sensor_fusion.py, one node at a time, with mujou.testing.

Each test runs a node alone under the virtual timer with :class:`mujou.testing.Harness`: it
feeds the node's inputs at chosen times, advances the time and looks at what the node sent
and at its state. No net is written around the node, and every run is reproducible, even for
the nodes made without a seed (they derive one from the run's seed and their name).

Run them with ``pytest examples/test_sensor_fusion.py``, or ``python
examples/test_sensor_fusion.py``, which runs pytest on this file.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from sensor_fusion import Accelerometer, Fusion, Gps, Tracking, Vehicle

import mujou.testing
from mujou.testing import Harness

torch.set_num_threads(1)  # a process-wide setting, made by the host before any run


@pytest.fixture
def fusion() -> Iterator[Harness]:
    """The filter, with no acceleration yet and a fix numbered 0 (not a new one)."""
    first = {"acceleration": torch.zeros(2), "fix": torch.tensor([0.0, 0.0, 0.0])}
    with Harness(Fusion(), inputs=first) as h:
        yield h


def test_the_vehicle_drives_on_a_circle_of_5_m() -> None:
    with Harness(Vehicle()) as h:
        h.advance(1.0)
        sent = h.sent("truth")
    assert len(sent) >= 99  # one every 10 ms
    for _, truth in sent:
        assert float(truth[:2].norm()) == pytest.approx(5.0)
        assert float(truth[2:].norm()) == pytest.approx(1.25)  # v**2 / r


def test_the_gps_numbers_its_fixes_and_adds_about_1_m_of_noise() -> None:
    truth = torch.tensor([3.0, 4.0, 0.0, 0.0])
    with Harness(Gps(), inputs={"truth": truth}) as h:
        h.advance(1.0)
        fixes = h.sent("fix")
    assert [round(t, 6) for t, _ in fixes][:4] == [0.2, 0.4, 0.6, 0.8]
    assert [int(fix[2]) for _, fix in fixes] == list(range(1, len(fixes) + 1))
    errors = torch.stack([fix[:2] - truth[:2] for _, fix in fixes])
    assert float(errors.abs().max()) < 4.0


def test_without_a_fix_the_filter_integrates_the_acceleration(fusion: Harness) -> None:
    fusion.feed("acceleration", torch.tensor([1.0, 0.0]))
    fusion.advance(1.0)
    time, estimate = fusion.sent("estimate")[-1]
    assert estimate.tolist() == pytest.approx([0.5 * time**2, 0.0], abs=1e-4)


def test_a_new_fix_pulls_the_estimate_to_it(fusion: Harness) -> None:
    fusion.feed("acceleration", torch.zeros(2))
    fusion.feed("fix", torch.tensor([10.0, -2.0, 1.0]), at=0.505)  # between two updates
    fusion.advance(0.515)
    before, after = fusion.sent("estimate")[-2:]
    assert before[1].tolist() == [0.0, 0.0]
    assert after[1].tolist() == pytest.approx([10.0, -2.0], abs=0.1)
    assert float(fusion.state()["last_fix"]) == 1.0


def test_the_accelerometer_is_reproducible_without_a_seed() -> None:
    states = []
    for _ in range(2):
        with Harness(Accelerometer(), inputs={"truth": torch.tensor([0.0, 0.0, 1.0, 2.0])}) as h:
            h.advance(1.0)
            noise = torch.stack([m - torch.tensor([1.0, 2.0]) for _, m in h.sent("acceleration")])
            states.append(h.state_dict())
        assert 0.05 < float(noise.std()) < 0.2  # the 0.1 of noise it adds
    mujou.testing.assert_states_equal(states[0], states[1])


def test_the_whole_net_is_reproducible() -> None:
    trees = []
    for workers in (1, 2):
        with Harness(Tracking(), workers=workers) as h:
            h.advance(1.0)
            trees.append(h.state_dict())
    mujou.testing.assert_states_equal(trees[0], trees[1])


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
