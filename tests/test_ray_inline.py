"""Ray's inline limit for simulated clients' messages: set for the Ray the simulation starts,
never over a user's value or an existing cluster's configuration."""

from __future__ import annotations

import pytest

from client_app import ray_inline


@pytest.fixture()
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(ray_inline.INLINE_LIMIT_ENV, raising=False)
    return monkeypatch


def test_sets_a_limit_above_the_default_cnns_message(clean_env: pytest.MonkeyPatch) -> None:
    import os

    assert ray_inline.inline_messages() is True
    limit = int(os.environ[ray_inline.INLINE_LIMIT_ENV])
    assert limit == 4 * 1024 * 1024
    assert limit > 221_000 > 100 * 1024  # the default CNN's message, Ray's default limit


def test_keeps_the_users_value(clean_env: pytest.MonkeyPatch) -> None:
    import os

    clean_env.setenv(ray_inline.INLINE_LIMIT_ENV, "102400")
    assert ray_inline.inline_messages() is False
    assert os.environ[ray_inline.INLINE_LIMIT_ENV] == "102400"


def test_leaves_an_existing_cluster_alone(clean_env: pytest.MonkeyPatch) -> None:
    import os

    clean_env.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert ray_inline.inline_messages() is False
    assert ray_inline.INLINE_LIMIT_ENV not in os.environ


def test_the_client_app_applies_it_when_imported() -> None:
    """Flower loads the ClientApp in flwr-simulation before ray.init; the import must set it."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", ray_inline.INLINE_LIMIT_ENV)}
    probe = ("import os, client_app.app; "
             f"print(os.environ.get({ray_inline.INLINE_LIMIT_ENV!r}))")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out[-1] == str(ray_inline.INLINE_LIMIT_BYTES)
