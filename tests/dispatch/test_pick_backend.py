"""The rule the fleet grants leases by and the forecast simulates (orchestrator/dispatch/pick.py)."""

from __future__ import annotations

from orchestrator.dispatch.pick import pick_backend


def test_the_lowest_load_with_room_wins_and_ties_rotate_from_start():
    assert pick_backend([3, 1, 2], [4, 4, 4], None, 0) == 1
    assert pick_backend([1, 2], [2, 8], None, 0) == 1  # 2/8 is less loaded than 1/2
    assert [pick_backend([0, 0, 0], [4, 4, 4], None, s) for s in range(4)] == [0, 1, 2, 0]  # start is taken mod n


def test_a_full_or_unhealthy_backend_gets_nothing():
    assert pick_backend([4, 2], [4, 4], None, 0) == 1
    assert pick_backend([0, 2], [4, 4], [False, True], 0) == 1
    assert pick_backend([4, 4], [4, 4], None, 0) is None
    assert pick_backend([0], [4], [False], 0) is None
