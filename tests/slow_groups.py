"""Which slow modules share what, so the slow suite can run on pytest-xdist workers.

`scripts/test.sh` runs ``pytest -m "slow and not alone" -n 3 --dist loadgroup`` (3 is
``SLOW_TEST_WORKERS``' default): every test of a module below is marked
``xdist_group(group)``, and conftest's scheduler (xdist's own loadgroup does not group
under pytest 9.2; tests/conftest.py says why) runs a group on one worker, one test at a
time. Modules that share a resource share a group; the rest get
a group of their own (a module's tests often reuse its ports, one after another). Modules
marked ``alone`` assert wall-clock bounds a busy neighbour can break; test.sh runs them
afterwards, two modules at a time, then the ``solitary`` ones by themselves.
tests/test_slow_groups.py checks the table against the modules' source.

Shared resources and how each is kept apart:
- fixed 127.0.0.1 ports (defaults; each module's FEDINIT_TEST_* variable moves them): a
  deployment of base port B takes B, B+1 and B+10.. one per node; ranges of different groups
  never overlap (checked);
- conftest's local SuperLink ports (SIM_HTTP_PORT/SIM_CONTROL_PORT) move by
  ``SIM_PORT_STEP`` per worker (gw0 +0, gw1 +10, ...), so `flwr run` tests on two workers
  never join each other's SuperLink;
- Docker: one engine for every module that uses it (tests/deploy_helpers.py's ENGINE_STATE:
  the last module out stops a dockerd the tests started), one image build at a time
  (deploy/build_images.sh's lock), and each module's own compose projects, container names
  and subnets: the two Docker modules are two groups;
- Ray: each simulation starts its own local instance on free ports (test_ray_cluster's
  cluster records its address in its own temp dir, where no other ``ray.init()`` looks).
"""

from __future__ import annotations

from dataclasses import dataclass

SIM_PORT_BASE = (39191, 39193)
"""conftest's local SuperLink ports (HTTP, Control) on worker gw0 or without xdist."""
SIM_PORT_STEP = 10
"""What each further worker adds to them."""
MAX_WORKERS = 10
"""Workers the per-worker SIM ports leave room for (up to 39283, below 39291)."""



@dataclass(frozen=True)
class Slow:
    """A slow module's xdist group, its fixed port ranges (inclusive), whether it must run
    with no neighbour, and how long its tests took."""

    group: str
    ports: tuple[tuple[int, int], ...] = ()
    alone: str = ""
    """Why the module runs alone (empty: it shares the workers)."""
    solitary: bool = False
    """An ``alone`` module that needs no neighbour at all, not even another alone module: the
    others run two at a time (mostly waiting on heartbeats and round timeouts, they all
    passed beside the whole slow suite, CI 2026-12-05), these one by one after them."""
    seconds: int = 0
    """Its tests' time summed (`--durations=0`, four slow workers, images cached, 2026-12-04):
    conftest's scheduler starts the longest groups first, so none is left to run by itself
    at the end."""


def deployment(base: int, nodes: int) -> tuple[int, int]:
    """The port range of a fedinit/cli/deploy_local.py deployment: link B, B+1; nodes B+10.."""
    return (base, base + 10 + nodes - 1)


def own(module: str, *ports: tuple[int, int], alone: str = "", solitary: bool = False,
        seconds: int = 0) -> Slow:
    """A group of the module's own."""
    return Slow(module, ports, alone, solitary, seconds)


SLOW_MODULES: dict[str, Slow] = {
    # Docker: the shared engine, own compose projects and subnets.
    "test_deploy_compose": own("test_deploy_compose", seconds=346),
    "test_deploy_images": own("test_deploy_images", (29961, 29963),  # + its host simulation
                              seconds=959),
    # Process deployments on fixed ports.
    "test_deploy_allowlist": own("test_deploy_allowlist", deployment(29870, 2), seconds=248),
    "test_deploy_async": own("test_deploy_async", deployment(43000, 4), seconds=96),
    "test_deploy_dashboard": own("test_deploy_dashboard", deployment(44000, 4),
                                 (44050, 44050), seconds=187),  # + the page
    "test_deploy_device_data": own("test_deploy_device_data", deployment(39620, 4), seconds=81),
    "test_deploy_divergence": own("test_deploy_divergence", deployment(42550, 3), seconds=77),
    "test_deploy_dp": own("test_deploy_dp", deployment(41100, 3), deployment(41150, 4),
                          deployment(41170, 4), seconds=172),
    "test_deploy_fedrelax": own("test_deploy_fedrelax", deployment(42400, 3), seconds=100),
    "test_deploy_process": own("test_deploy_process", deployment(29500, 3),
                               deployment(29540, 3), deployment(29560, 3),
                               (39291, 39293), seconds=390),  # + deploy_helpers' simulation link
    "test_deploy_regimes": own("test_deploy_regimes", deployment(42500, 3), seconds=101),
    "test_deploy_secagg": own("test_deploy_secagg", deployment(42650, 4), seconds=95),
    "test_link_scenarios": own("test_link_scenarios", deployment(44200, 3),
                               deployment(44250, 3), seconds=230),  # + proxies at base + 5
    "test_device_privacy": own("test_device_privacy", deployment(43770, 3), seconds=71),
    "test_superlink_crash": own("test_superlink_crash", deployment(39800, 3),
                                deployment(39850, 5), seconds=367),
    "test_deploy_faults": own(
        "test_deploy_faults", deployment(29700, 3), deployment(29750, 3),
        deployment(39400, 5),
        alone="collect-seconds < round-timeout + 3 s: a neighbour's CPU delays the replies",
        seconds=206),
    "test_edge_fleet": own(
        "test_edge_fleet", deployment(39660, 6),
        alone="collect-seconds < round-timeout + 3 s, as test_deploy_faults", seconds=79),
    "test_warm_executor": own(
        "test_warm_executor", deployment(29600, 3),
        alone="a round < 30 s and a hung round within 10 s of its deadline", seconds=59),
    # `flwr run` simulations on their own local SuperLink ports.
    "test_ray_cluster": own("test_ray_cluster", (39591, 39593), seconds=298),
    "test_ray_loopback": own("test_ray_loopback", (39891, 39893), seconds=79),
    "test_sweep": own("test_sweep", (39391, 39393), seconds=169),
    "test_screenshots": own("test_screenshots", (44060, 44061), seconds=34),
    # `flwr run` on conftest's per-worker SIM ports, or free ports: nothing shared.
    "test_async_resume": own("test_async_resume", seconds=290),
    "test_example_app": own("test_example_app", seconds=279),
    "test_first_hour": own("test_first_hour", seconds=65),
    # One check each in a fresh interpreter or a FAB build (11-23 s of CPU): out of the fast
    # suite, which must stay under 2 minutes on 2 cores.
    "test_app_source": own("test_app_source", seconds=15),
    "test_flower_compat": own("test_flower_compat", seconds=23),
    "test_ray_inline": own("test_ray_inline", seconds=17),
    "test_strategies": own("test_strategies", seconds=12),
    "test_task_models": own("test_task_models", seconds=17),
    "test_resume_simulation": own("test_resume_simulation", seconds=509),
    "test_simulation_e2e": own("test_simulation_e2e", seconds=152),
    "test_plain_flwr_run": own(
        "test_plain_flwr_run",
        alone="a refusal within 5 s of a fresh interpreter's start, and a run within 90 s",
        solitary=True, seconds=49),  # the 5 s bound broke beside the slow suite (CI, 2026-12-05)
    # In-process runs, a browser on port 0, data sets: nothing shared.
    "test_async_rounds": own("test_async_rounds"),
    "test_dashboard_browser": own("test_dashboard_browser", seconds=23),
    "test_fedrelax_groups_resume": own("test_fedrelax_groups_resume", seconds=6),
    "test_fedrelax_server_step_resume": own("test_fedrelax_server_step_resume", seconds=8),
    "test_methods_state": own("test_methods_state", seconds=45),
    "test_node_fast_paths": own("test_node_fast_paths", seconds=17),
    "test_personal_eval": own("test_personal_eval"),
    "test_strategy_components_runs": own("test_strategy_components_runs", seconds=25),
    "test_task_datasets": own("test_task_datasets"),
}


def group_seconds(group: str) -> int:
    """A group's measured test time (0 for a scope that is no slow group: a single test)."""
    return sum(slow.seconds for slow in SLOW_MODULES.values() if slow.group == group)


def sim_ports(worker: str, base: tuple[int, int] = SIM_PORT_BASE) -> tuple[int, int]:
    """conftest's local SuperLink ports (HTTP, Control) for xdist worker ``worker`` ("gw1";
    "" without xdist): ``base`` (a FEDINIT_TEST_*_PORT override moves it) plus
    ``SIM_PORT_STEP`` per worker number."""
    if not worker:
        return base
    if not (worker.startswith("gw") and worker[2:].isdigit()):
        raise ValueError(f"PYTEST_XDIST_WORKER={worker!r} is not gwN")
    n = int(worker[2:])
    if n >= MAX_WORKERS:
        raise ValueError(f"PYTEST_XDIST_WORKER={worker!r}: at most {MAX_WORKERS} workers "
                         f"(gw0..gw{MAX_WORKERS - 1}) have local SuperLink ports")
    return base[0] + SIM_PORT_STEP * n, base[1] + SIM_PORT_STEP * n
