"""``RunConfig.parse(..., sized=False)``: a strategy's constructor parses before it has seen
the federation, with a stand-in client count. Every check that reads the client count or
the round size waits for the sized parse (``start()``); every other check still runs."""

from typing import Any

import pytest

from fedinit.config import ConfigError, RunConfig

STAND_IN = {"num-clients": 1_000_000}
"""What the constructor parses with (``strategies.base.ANY_FEDERATION``)."""

SIZE_DEPENDENT: list[tuple[dict[str, Any], str]] = [
    ({"num-clients": 10, "fraction-train": 0.1, "min-replies": 2}, "min-replies=2"),
    ({"num-clients": 10, "fraction-train": 0.3, "aggregation": "krum", "byzantine-f": 1},
     "byzantine-f=1"),
    ({"num-clients": 10, "min-clients": 11}, "min-clients=11"),
    ({"num-clients": 10, "concurrency": 11}, "concurrency=11"),
    ({"num-clients": 10, "fraction-train": 0.5, "over-select": 2.0}, "over-select=2.0"),
    ({"num-clients": 10, "fraction-train": 0.3, "secure-aggregation": "secagg+",
      "weighting": "uniform", "max-update-norm-ratio": 0.0, "secagg-threshold": 4,
      "personal-eval-every": 0},
     "secagg-threshold=4"),
    ({"num-clients": 10, "train-limit": 5}, "train-limit=5"),
    ({"num-clients": 3, "num-regimes": 4}, "num-regimes=4"),
]


@pytest.mark.parametrize(("raw", "key"), SIZE_DEPENDENT)
def test_a_size_check_runs_sized_and_waits_otherwise(raw: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=f"{key} is not allowed"):
        RunConfig.parse(raw)
    # the same settings before the federation is known: nothing refused yet
    RunConfig.parse({**raw, **STAND_IN}, sized=False)


def test_the_stand_in_count_itself_is_never_checked() -> None:
    """A stand-in far below a real check's bound (1 client) passes, so no line can quote it."""
    RunConfig.parse({"num-clients": 1, "fraction-train": 0.1, "min-replies": 3,
                     "concurrency": 4, "min-clients": 5}, sized=False)


@pytest.mark.parametrize(("raw", "key"), [
    ({"min-replies": 0}, "min-replies=0"),
    ({"concurrency": -1}, "concurrency=-1"),
    ({"min-clients": -1}, "min-clients=-1"),
    ({"aggregation": "krum", "byzantine-f": -1}, "byzantine-f=-1"),
    ({"fraction-train": 1.5}, "fraction-train=1.5"),
    ({"over-select": 0.5, "dp": "central", "weighting": "uniform"}, "dp='central'"),
])
def test_every_other_check_still_runs_unsized(raw: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        RunConfig.parse({**raw, **STAND_IN}, sized=False)


def test_an_async_krum_buffer_of_the_round_size_waits_but_a_given_one_is_checked() -> None:
    krum = {"rounds": "async", "aggregation": "krum", "byzantine-f": 1,
            "evaluation": "central", "personal-eval-every": 0, **STAND_IN}
    RunConfig.parse({**krum, "fraction-train": 0.000002}, sized=False)  # m is not known
    with pytest.raises(ConfigError) as err:
        RunConfig.parse({**krum, "buffer-size": 3}, sized=False)
    line = str(err.value)
    assert "buffer-size=3 is not allowed; allowed: at least 5 (0: concurrency=the clients " \
           "per round)" in line
    assert "1000000" not in line
