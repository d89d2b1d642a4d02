"""The slow suite's xdist groups (tests/slow_groups.py) against the slow modules' own source:
every slow module has a group, the Docker modules' own networks differ, no two groups' fixed
ports overlap, every port a module names lies in the ranges it declared, and the longest
group starts first."""

from __future__ import annotations

import re
from itertools import combinations
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import conftest
from tests.slow_groups import (
    MAX_WORKERS,
    SIM_PORT_BASE,
    SIM_PORT_STEP,
    SLOW_MODULES,
    deployment,
    group_seconds,
    sim_ports,
)

TESTS = Path(__file__).parent
PORT_LITERAL = re.compile(r"(?<![\d.])(29\d{3}|3\d{4}|4[0-4]\d{3})(?![\d.])")
"""A number in 29000-44999 (the tests' fixed ports), not part of a longer number or a decimal."""
SIM_RANGE = (SIM_PORT_BASE[0], SIM_PORT_BASE[1] + SIM_PORT_STEP * (MAX_WORKERS - 1))
"""conftest's local SuperLink ports over every worker: any module may name them."""
FLOWER_DEFAULTS = {39091, 39093}
"""Flower's own local SuperLink ports: tests name them (to stay off them), none listens there."""


def slow_modules() -> dict[str, str]:
    """{module: source} of every test module with a slow test."""
    return {p.stem: text for p in sorted(TESTS.glob("test_*.py"))
            if "pytest.mark.slow" in (text := p.read_text()) and p.stem != "test_slow_groups"}


def stray_ports(source: str, ranges: tuple[tuple[int, int], ...]) -> list[int]:
    """Port-like numbers in ``source`` outside ``ranges`` and conftest's SIM ports."""
    allowed = (*ranges, SIM_RANGE)
    return sorted({int(m) for m in PORT_LITERAL.findall(source)
                   if not any(lo <= int(m) <= hi for lo, hi in allowed)} - FLOWER_DEFAULTS)


def test_every_slow_module_has_a_group_and_no_other_module_does() -> None:
    assert sorted(slow_modules()) == sorted(SLOW_MODULES)


SUBNET = re.compile(r"172\.3[01]\.(\d+)")
"""The third octet of a compose network the tests ask for (172.30.x fleet, 172.31.x control)."""


def test_the_docker_modules_run_apart_on_their_own_networks() -> None:
    """Two groups on two workers share one engine: their compose stacks must never ask for
    the same subnet (test_deploy_compose runs docker-compose.yml's defaults)."""
    sources = slow_modules()
    docker = sorted(m for m, text in sources.items() if "docker_session" in text)
    assert docker == ["test_deploy_compose", "test_deploy_images"]
    assert len({SLOW_MODULES[m].group for m in docker}) == 2
    defaults = set(SUBNET.findall((TESTS.parent / "docker-compose.yml").read_text()))
    compose = set(SUBNET.findall(sources["test_deploy_compose"])) | defaults
    images = set(SUBNET.findall(sources["test_deploy_images"]))
    assert images and compose and not images & compose, (images, compose)


def test_every_port_a_module_names_is_in_its_declared_ranges() -> None:
    sources = slow_modules()
    strays = {m: found for m, s in SLOW_MODULES.items()
              if (found := stray_ports(sources[m], s.ports))}
    assert strays == {}


def test_the_port_check_finds_a_port_outside_the_ranges() -> None:
    source = 'BASE_PORT = int(os.environ.get("X", "42550"))  # 0.39191 and 139191 are no ports'
    assert stray_ports(source, (deployment(42500, 3),)) == [42550]
    assert stray_ports(source, (deployment(42550, 3),)) == []
    assert stray_ports('HTTP = "39201"', ()) == []  # conftest's port on gw1


def test_no_two_groups_fixed_ports_overlap() -> None:
    ranges: dict[str, list[tuple[int, int]]] = {"conftest SIM ports": [SIM_RANGE]}
    for slow in SLOW_MODULES.values():
        ranges.setdefault(slow.group, []).extend(slow.ports)
    clashes = [(a, b, ra, rb) for (a, ras), (b, rbs) in combinations(ranges.items(), 2)
               for ra in ras for rb in rbs if ra[0] <= rb[1] and rb[0] <= ra[1]]
    assert clashes == []


def test_deployment_ranges_cover_link_and_nodes() -> None:
    assert deployment(29700, 3) == (29700, 29712)  # link 29700/29701, nodes 29710-29712


def test_each_worker_gets_its_own_local_superlink_ports() -> None:
    assert sim_ports("") == SIM_PORT_BASE == sim_ports("gw0")
    assert sim_ports("gw1") == (SIM_PORT_BASE[0] + SIM_PORT_STEP, SIM_PORT_BASE[1] + SIM_PORT_STEP)
    assert sim_ports("gw2", (40001, 40003)) == (40021, 40023)  # an override moves the base
    with pytest.raises(ValueError, match=r"'gw10': at most 10 workers"):
        sim_ports(f"gw{MAX_WORKERS}")
    with pytest.raises(ValueError, match=r"'main' is not gwN"):
        sim_ports("main")


def test_collection_marks_a_modules_tests_with_its_group_and_alone() -> None:
    def item(stem: str) -> SimpleNamespace:
        marks: list[pytest.MarkDecorator] = []
        return SimpleNamespace(path=TESTS / f"{stem}.py", marks=marks, add_marker=marks.append)

    faults, compose, fast = item("test_deploy_faults"), item("test_deploy_compose"), item("test_x")
    plain = item("test_plain_flwr_run")
    for each in (faults, compose, fast, plain):
        conftest.pytest_itemcollected(each)  # type: ignore[arg-type]
    assert [(m.name, m.args) for m in faults.marks] == [
        ("xdist_group", ("test_deploy_faults",)), ("alone", ())]
    assert [m.name for m in plain.marks] == ["xdist_group", "alone", "solitary"]
    assert [(m.name, m.args) for m in compose.marks] == [
        ("xdist_group", ("test_deploy_compose",))]
    assert fast.marks == []


def test_loadgroup_schedules_by_the_table() -> None:
    """xdist's own loadgroup does not group under pytest 9.2 (conftest says why): the
    scheduler conftest installs takes each test's scope from the table instead."""
    assert conftest.slow_group_of("tests/test_deploy_images.py::test_x[a]") == \
        "test_deploy_images"
    assert conftest.slow_group_of("tests/test_deploy_dp.py::test_z") == "test_deploy_dp"
    assert conftest.slow_group_of("tests/test_fleet.py::test_w") == "tests/test_fleet.py::test_w"
    load = SimpleNamespace(getvalue=lambda key: "load")
    assert conftest.pytest_xdist_make_scheduler(load, None) is None  # type: ignore[arg-type]


def test_the_longest_waiting_group_is_assigned_first() -> None:
    """xdist orders groups by test count; the table's measured seconds decide instead."""
    config = SimpleNamespace(getvalue=lambda key: {"dist": "loadgroup", "tx": ["popen"],
                                                  "numprocesses": 3}.get(key))
    sched = conftest.pytest_xdist_make_scheduler(config, None)  # type: ignore[arg-type]
    sent: list[list[int]] = []

    class Worker:  # xdist's WorkerController, as far as the scheduler uses it
        def send_runtest_some(self, indices: list[int]) -> None:
            sent.append(indices)

    node = Worker()
    ids = ["tests/test_fleet.py::test_a", "tests/test_deploy_dp.py::test_b",
           "tests/test_deploy_images.py::test_c", "tests/test_deploy_images.py::test_d"]
    sched.registered_collections[node] = ids  # type: ignore[union-attr]
    for scope in ("tests/test_fleet.py::test_a", "test_deploy_dp", "test_deploy_images"):
        sched.workqueue[scope] = {i: False for i in ids  # type: ignore[union-attr]
                                  if conftest.slow_group_of(i) == scope}
    assert group_seconds("test_deploy_images") > group_seconds("test_deploy_dp") > 0
    assert group_seconds("tests/test_fleet.py::test_a") == 0
    for _ in range(3):
        sched._assign_work_unit(node)  # type: ignore[union-attr]
    assert sent == [[2, 3], [1], [0]]


def test_only_an_alone_module_is_solitary() -> None:
    assert all(slow.alone for slow in SLOW_MODULES.values() if slow.solitary)
