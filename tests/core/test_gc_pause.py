"""The cyclic collector while a plan is made: off, and given back as it was (`planner.gc_pause`)."""

from __future__ import annotations

import gc

import pytest

from controller.core.planner.gc_pause import cyclic_gc_paused


def test_the_collector_is_off_inside_and_given_back_as_it_was() -> None:
    assert gc.isenabled()
    with cyclic_gc_paused():
        assert not gc.isenabled()
        with cyclic_gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled(), "an inner pause ending gives nothing back while the outer one lasts"
    assert gc.isenabled()
    gc.disable()
    try:
        with cyclic_gc_paused():
            pass
        assert not gc.isenabled(), "a collector its caller turned off stays off"
    finally:
        gc.enable()


def test_an_error_inside_still_gives_the_collector_back() -> None:
    with pytest.raises(RuntimeError), cyclic_gc_paused():
        raise RuntimeError("a plan failed")
    assert gc.isenabled()
