"""Ray's inline limit for simulated clients' messages: set for the Ray the simulation starts,
never over a user's value or an existing cluster's configuration, and only while Flower's
engine loads the ClientApp (never by importing it)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from fedinit.flower_compat import guard, ray_inline


@pytest.fixture()
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(ray_inline.INLINE_LIMIT_ENV, raising=False)
    guard.forget()
    yield monkeypatch
    guard.forget()


def test_sets_a_limit_above_the_default_cnns_message(clean_env: pytest.MonkeyPatch) -> None:
    assert ray_inline.inline_messages() is True
    limit = int(os.environ[ray_inline.INLINE_LIMIT_ENV])
    assert limit == 4 * 1024 * 1024
    assert limit > 221_000 > 100 * 1024  # the default CNN's message, Ray's default limit


def test_keeps_the_users_value(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv(ray_inline.INLINE_LIMIT_ENV, "102400")
    assert ray_inline.inline_messages() is False
    assert os.environ[ray_inline.INLINE_LIMIT_ENV] == "102400"


def test_leaves_an_existing_cluster_alone(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert ray_inline.inline_messages() is False
    assert ray_inline.INLINE_LIMIT_ENV not in os.environ


def test_outside_flowers_engine_nothing_changes(clean_env: pytest.MonkeyPatch) -> None:
    assert ray_inline.apply() is False
    assert ray_inline.INLINE_LIMIT_ENV not in os.environ


PROBE = """
import os, sys, threading
from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.superlink.fleet.vce.metrics import VceMetrics
from flwr.supercore.run import Run

seen = []
def run_api(app_fn, backend_fn, *args):  # where Flower builds the RayBackend (ray.init)
    seen.append(os.environ.get("RAY_max_direct_call_object_size"))
vce_api.run_api = run_api
run = Run.create_empty(run_id=1)
vce_api.start_vce(backend_name="ray", backend_config_json_stream="{}", app_dir=sys.argv[1],
                  is_app=False, f_stop=threading.Event(), run=run, metrics=VceMetrics(),
                  client_app_attr="client_app.app:app", num_supernodes=1)
print("at-ray-init", seen[0])
"""


@pytest.mark.slow  # Flower's simulation engine in a fresh interpreter: about 17 s
def test_flowers_engine_loading_the_client_app_sets_it_before_ray_starts() -> None:
    """Flower's own ``start_vce`` loads ``client_app.app:app`` (as in ``flwr-simulation``);
    the limit is in the environment when it goes on to start Ray, not before."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", ray_inline.INLINE_LIMIT_ENV)}
    out = subprocess.run([sys.executable, "-c", PROBE, str(repo)], env=env, cwd=repo,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["at-ray-init", str(ray_inline.INLINE_LIMIT_BYTES)]
