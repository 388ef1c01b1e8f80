"""psgd.stragglers' draws: seeded per worker and epoch, none adds nothing."""

from types import SimpleNamespace

import pytest

from psgd.stragglers import Stragglers, describe, simulated


def draws(rank: int, epoch: int, n: int, **settings) -> list[float]:
    """The first `n` extra delays worker `rank` sleeps in `epoch`."""
    stragglers = Stragglers(seed=0, **settings)
    stragglers.on_train_epoch_start(SimpleNamespace(global_rank=rank, current_epoch=epoch), None)
    return [stragglers.delay() for _ in range(n)]


JITTER = {"delay_s": 0.01, "distribution": "exponential", "shift_s": 0.002}


def test_a_seeded_exponential_delay_draws_the_same_sequence_on_a_rerun_and_its_own_per_worker_and_epoch():
    first = draws(1, 2, 2000, **JITTER)
    assert first == draws(1, 2, 2000, **JITTER)  # a rerun
    assert first != draws(0, 2, 2000, **JITTER) and first != draws(1, 3, 2000, **JITTER)
    assert min(first) >= 0.002  # shift_s + Exp(mean delay_s): mean 0.012, std 0.01 / sqrt(2000)
    assert sum(first) / len(first) == pytest.approx(0.012, abs=0.001)


def test_distribution_none_adds_no_wait_and_fixed_adds_delay_s():
    assert draws(0, 0, 5, delay_s=0.5, distribution="none") == [0.0] * 5
    assert draws(0, 0, 5, delay_s=0.5, distribution="fixed") == [0.5] * 5


def test_psgd_adds_the_simulation_only_when_asked():
    assert not simulated({"slowdown": None, "delay_s": 0.5, "distribution": "none", "shift_s": 0.0})
    assert simulated({"slowdown": [1, 1], "delay_s": 0.0, "distribution": "none", "shift_s": 0.0})
    assert simulated({"slowdown": None, "delay_s": 0.0, "distribution": "fixed", "shift_s": 0.0})


def test_the_console_line_says_which_worker_is_slow_and_what_every_worker_sleeps():
    settings = {"slowdown": [1, 1, 1, 3], "delay_s": 0.01, "distribution": "exponential", "shift_s": 0.002}
    assert describe(settings) == "worker 3 3x slower, every worker sleeps 0.002 s + Exp(mean 0.01 s) after each step"
    assert describe(settings | {"slowdown": [1, 1], "distribution": "none"}) == "every worker at its own speed"
