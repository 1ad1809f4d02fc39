"""The reconciler's wake-ups (routing/changes.py): what `wait` and `take_services`
hand over, and that nothing notified is lost between them."""

from __future__ import annotations

from controlplane.routing.changes import RouteChanges


async def test_services_taken_during_a_pass_are_not_handed_out_again() -> None:
    changes = RouteChanges()
    changes.notify("checkout")
    changes.notify("cart")
    assert changes.take_services() == {"checkout", "cart"}
    assert changes.take_services() == frozenset()
    wake = await changes.wait(0)
    assert not wake.services and not wake.full and not wake.configs


async def test_a_config_notice_stays_for_the_next_wait() -> None:
    changes = RouteChanges()
    changes.notify("checkout")
    changes.notify_configs()
    assert changes.take_services() == {"checkout"}
    wake = await changes.wait(0)
    assert wake.configs and not wake.services


async def test_while_a_full_pass_is_asked_nothing_is_taken() -> None:
    changes = RouteChanges()
    changes.notify_all()
    changes.notify("checkout")
    assert changes.take_services() == frozenset()
    wake = await changes.wait(0)
    assert wake.full


async def test_a_notice_after_a_take_wakes_the_next_wait() -> None:
    changes = RouteChanges()
    changes.notify("checkout")
    changes.take_services()
    changes.notify("cart")
    wake = await changes.wait(0)
    assert wake.services == {"cart"}
