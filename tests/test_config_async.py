"""``rounds=async`` keys: defaults, one-line range errors and the refused combinations."""

from __future__ import annotations

import dataclasses

import pytest

from fedinit.config import ConfigError, RunConfig, choices
from fedinit.methods.fedbuff import STALENESS_KINDS
from fedinit.methods.registry import METHOD_NAMES, METHODS, async_methods

ASYNC = {"rounds": "async", "personal-eval-every": 0}


def test_sync_is_the_default_and_async_defaults_follow_the_round_size() -> None:
    assert RunConfig.parse({}).schedule.rounds == "sync"
    cfg = RunConfig.parse({**ASYNC, "num-clients": 20, "fraction-train": 0.25})
    assert (cfg.async_concurrency, cfg.async_buffer_size) == (5, 5)
    cfg = RunConfig.parse({**ASYNC, "concurrency": 8, "buffer-size": 3})
    assert (cfg.async_concurrency, cfg.async_buffer_size) == (8, 3)
    assert choices.STALENESS_KINDS == STALENESS_KINDS  # the config's list is the rule's


@pytest.mark.parametrize(("over", "line"), [
    ({"rounds": "asyn"}, "rounds='asyn' is not allowed (did you mean 'async'?)"),
    ({"concurrency": 101}, "concurrency=101 is not allowed; allowed: 0 (the clients per round) "
                           "to num-clients=100"),
    ({"buffer-size": -1}, "buffer-size=-1 is not allowed; allowed: an integer >= 0 (0 = "
                          "concurrency)"),
    ({"max-staleness": -2}, "max-staleness=-2 is not allowed; allowed: an integer >= 0 (0 = "
                            "no limit)"),
    ({"staleness": "linear"}, "staleness='linear' is not allowed"),
    ({"staleness-a": -0.5}, "staleness-a=-0.5 is not allowed; allowed: a number >= 0"),
    ({"staleness-b": -1.0}, "staleness-b=-1.0 is not allowed"),
])
def test_range_errors_are_one_line(over: dict[str, object], line: str) -> None:
    with pytest.raises(ConfigError, match="^run config: ") as err:
        RunConfig.parse(over)
    assert line in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("method", [m for m in METHOD_NAMES if m not in async_methods()])
def test_each_other_method_is_refused_with_its_reason(method: str) -> None:
    extra = {"beta": 0.0} if method in ("fedrelax", "clustered") else {}
    with pytest.raises(ConfigError) as err:
        RunConfig.parse({**ASYNC, "method": method, **extra})
    text = str(err.value)
    allowed = " | ".join(async_methods())
    assert f"method={method!r} is not allowed; allowed: {allowed} with rounds='async'" in text
    assert f"({method}: {METHODS[method].async_refusal})" in text and "\n" not in text


def test_a_methods_own_spec_says_whether_it_runs_async(monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal and the allowed list both follow ``MethodSpec.async_refusal``."""
    assert RunConfig.parse({**ASYNC, "method": "fedsam"}).method == "fedsam"
    monkeypatch.setattr("fedinit.methods.fedsam.SPEC",
                        dataclasses.replace(METHODS["fedsam"], async_refusal="a reason"))
    assert "fedsam" not in async_methods() and "fedavg" in async_methods()
    with pytest.raises(ConfigError) as err:
        RunConfig.parse({**ASYNC, "method": "fedsam"})
    assert str(err.value) == (f"run config: method='fedsam' is not allowed; allowed: "
                              f"{' | '.join(async_methods())} with rounds='async' "
                              f"(fedsam: a reason)")


@pytest.mark.parametrize(("over", "key"), [
    ({"dp": "local", "weighting": "uniform"}, "dp='local'"),
    ({"evaluation": "federated"}, "evaluation='federated'"),
    ({"personal-eval-every": 20}, "personal-eval-every=20"),
    ({"divergence-every": 2}, "divergence-every=2"),
])
def test_what_async_cannot_run_yet_is_refused(over: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=f"{key} is not allowed; .* with rounds='async' \\("):
        RunConfig.parse({**ASYNC, **over})
    RunConfig.parse({**over, "rounds": "sync"})


def test_central_dp_runs_async_local_and_distributed_are_refused_with_their_reasons() -> None:
    dp = {**ASYNC, "dp": "central", "weighting": "uniform"}
    assert RunConfig.parse(dp).privacy.dp == "central"
    with pytest.raises(ConfigError) as err:
        RunConfig.parse({**dp, "dp": "local"})
    assert "dp='local' is not allowed; allowed: off | central with rounds='async'" in str(
        err.value) and "understate" in str(err.value)
    with pytest.raises(ConfigError) as err:
        RunConfig.parse({**dp, "dp": "distributed", "secure-aggregation": "secagg+",
                         "min-replies": 10})
    assert ("dp='distributed' is not allowed; allowed: off | central with rounds='async' "
            "(distributed DP needs secure aggregation, which is sync only)") in str(err.value)
    RunConfig.parse({**dp, "num-clients": 4, "concurrency": 4, "buffer-size": 4})
    with pytest.raises(ConfigError, match="buffer-size=5 is not allowed; allowed: at most "
                                          "num-clients=4 with dp='central' .*at most once"):
        RunConfig.parse({**dp, "num-clients": 4, "concurrency": 4, "buffer-size": 5})
    RunConfig.parse({**ASYNC, "num-clients": 4, "concurrency": 4, "buffer-size": 5})
