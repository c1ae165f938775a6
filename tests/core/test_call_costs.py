"""A kind of call's cost: the quickest of its last few, so one unlucky call moves nothing."""

from __future__ import annotations

from tfservo.core.call_costs import LOOP_SECONDS, CallCosts


def test_a_kind_is_unknown_until_its_first_call_then_costs_its_quickest_recent_one() -> None:
    costs = CallCosts(kept=3)
    assert costs.cost("k") is None and not costs.quick("k")
    costs.note("k", 0.0004)
    assert costs.cost("k") == 0.0004 and costs.quick("k")
    costs.note("k", 0.005)  # the GIL or the OS, once
    costs.note("k", 0.004)
    assert costs.quick("k")
    costs.note("k", 0.006)  # three slow ones in a row: it is slow now
    assert costs.cost("k") == 0.004 and not costs.quick("k")
    costs.note("k", LOOP_SECONDS / 2)  # one quick call shows what the work costs
    assert costs.quick("k")


def test_kinds_are_forgotten_all_at_once_past_the_bound() -> None:
    costs = CallCosts(max_kinds=2)
    costs.note("a", 0.0001)
    costs.note("b", 0.0001)
    costs.note("c", 0.0001)
    assert costs.cost("a") is None and costs.cost("b") is None and costs.cost("c") == 0.0001
