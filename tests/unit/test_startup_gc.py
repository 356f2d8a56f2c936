"""The collector is off while a run starts, and the startup's objects are frozen after."""

import gc

import pytest

from trinity.utils.startup_gc import paused_until_started


def test_off_while_starting_then_frozen_then_restored():
    assert gc.isenabled()
    with paused_until_started() as started:
        assert not gc.isenabled()
        started()
        assert gc.isenabled()
        assert gc.get_freeze_count() > 0
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_a_failing_start_turns_the_collector_back_on():
    with pytest.raises(ValueError), paused_until_started():
        raise ValueError("bad config")
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_a_caller_that_had_it_off_keeps_it_off():
    gc.disable()
    try:
        with paused_until_started() as started:
            started()
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
