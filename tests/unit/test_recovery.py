"""The inventory a run's next attempt takes after losing hosts (plan/recovery.py), and the
plan made from it: spares take a lost host's place and its task indices, --shrink renumbers
the workers that remain, and what cannot be recovered is refused saying why."""
from __future__ import annotations

import pytest

from deploy.inventory.load import parse_inventory
from deploy.plan.planner import Options, plan_run
from deploy.plan.recovery import NoRecovery, recovered

HOSTS = ("hosts:\n"
         "  - {name: h0, address: 127.0.0.10}\n"
         "  - {name: h1, address: 127.0.0.11, workers: 2}\n"
         "  - {name: h2, address: 127.0.0.12}\n")
SPARES = ("  - {name: s0, address: 127.0.0.20, role: spare}\n"
          "  - {name: s1, address: 127.0.0.21, role: spare}\n")


def inventory(text: str):
    return parse_inventory(text, "lab.yaml", {})


def placed(inv) -> list[tuple[str, int, str]]:
    """(host, task index, endpoint address) of every task of the plan made from `inv`."""
    plan = plan_run(inv, Options(), "r1", {i: 5000 + i for i in range(inv.task_count)})
    return [(t.host.name, t.index, t.endpoint.rsplit(":", 1)[0]) for t in plan.tasks]


def test_a_spare_takes_the_lost_hosts_place_and_task_indices():
    before = inventory(HOSTS + SPARES)
    after = recovered(before, {"h1"})
    assert after.moved == (("h1", "s0"),) and after.dropped == ()
    assert placed(after.inventory) == [("h0", 0, "127.0.0.10"), ("s0", 1, "127.0.0.20"),
                                       ("s0", 2, "127.0.0.20"), ("h2", 3, "127.0.0.12")]
    # The lost host stays, as a spare without tasks: the record keeps it for `inv down`.
    assert [(h.name, h.role) for h in after.inventory.hosts] == [
        ("h0", "worker"), ("s0", "worker"), ("h2", "worker"), ("h1", "spare"), ("s1", "spare")]
    assert after.shown() == "s0 takes the tasks of h1"


def test_a_host_lost_earlier_is_never_taken_as_a_spare():
    first = recovered(inventory(HOSTS + SPARES), {"h2"})
    second = recovered(first.inventory, {"h2", "h0"})
    assert second.moved == (("h0", "s1"),)
    assert [h.name for h in second.inventory.hosts if h.tasks] == ["s1", "h1", "s0"]
    with pytest.raises(NoRecovery, match="h1 is lost and no spare is left"):
        recovered(second.inventory, {"h2", "h0", "h1"})


def test_shrink_renumbers_the_remaining_workers_and_the_next_one_is_chief():
    after = recovered(inventory(HOSTS), {"h0"}, shrink=True)
    assert after.dropped == ("h0",)
    assert placed(after.inventory) == [("h1", 0, "127.0.0.11"), ("h1", 1, "127.0.0.11"),
                                       ("h2", 2, "127.0.0.12")]
    plan = plan_run(after.inventory, Options(), "r1")
    assert plan.chief.host.name == "h1"
    assert plan.tasks[0].launch.env["TFDEPLOY_NUM_WORKERS"].value == "3"
    assert after.shown() == "going on without h0: 3 worker(s) on h1, h2"


def test_spares_first_then_shrink():
    text = HOSTS + "  - {name: s0, address: 127.0.0.20, role: spare}\n"
    after = recovered(inventory(text), {"h0", "h2"}, shrink=True)
    assert after.moved == (("h0", "s0"),) and after.dropped == ("h2",)
    assert placed(after.inventory) == [("s0", 0, "127.0.0.20"), ("h1", 1, "127.0.0.11"),
                                       ("h1", 2, "127.0.0.11")]


@pytest.mark.parametrize("lost, shrink, least, says", [
    ({"h2"}, False, 1, "h2 is lost and no spare is left to take its tasks (--shrink"),
    ({"h1"}, True, 3, "without h1 2 worker(s) would remain, fewer than --min-workers 3"),
    ({"h0", "h1", "h2"}, True, 1, "fewer than --min-workers 1"),
])
def test_what_cannot_be_recovered_says_why(lost, shrink, least, says):
    with pytest.raises(NoRecovery) as info:
        recovered(inventory(HOSTS), lost, shrink, least)
    assert says in str(info.value)


def test_a_lost_spare_changes_nothing():
    before = inventory(HOSTS + SPARES)
    after = recovered(before, {"s0"})
    assert after.inventory == before and after.moved == () and after.dropped == ()


def test_a_spare_with_gpus_is_refused_at_load():
    with pytest.raises(Exception) as info:
        inventory(HOSTS + "  - {name: s0, address: 127.0.0.20, role: spare, gpus: [0]}\n")
    assert "host 's0': field 'gpus': a spare takes the tasks of a lost host" in str(info.value)
