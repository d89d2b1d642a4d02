"""``secure-aggregation`` keys: defaults, one-line range errors and every refused combination
(anything whose server needs one client's upload, which it never sees under SecAgg+)."""

from __future__ import annotations

import dataclasses

import pytest

from fedinit.config import ConfigError, RunConfig, choices
from fedinit.methods.registry import METHOD_NAMES, METHODS, secagg_methods
from fedinit.secure_aggregation.params import MAX_BITS, SecAggParams

SECAGG = {"secure-aggregation": "secagg+", "weighting": "uniform", "personal-eval-every": 0,
          "max-update-norm-ratio": 0.0}


def refusal(over: dict[str, object]) -> str:
    with pytest.raises(ConfigError, match="^run config: ") as err:
        RunConfig.parse(over)
    text = str(err.value)
    assert "\n" not in text
    return text


def test_off_is_the_default_and_the_defaults_are_valid_protocol_parameters() -> None:
    cfg = RunConfig.parse({})
    assert cfg.privacy.secure_aggregation == "off"
    on = RunConfig.parse(SECAGG)
    p = on.privacy
    params = SecAggParams(threshold=p.secagg_threshold, num_shares=p.secagg_num_shares,
                          clip=p.secagg_clip, bits=p.secagg_bits)  # the core accepts them
    assert params.threshold <= on.clients_per_round <= params.max_clients
    assert choices.SECAGG_MAX_BITS == MAX_BITS  # the config's cap is the core's


@pytest.mark.parametrize(("over", "line"), [
    ({"secure-aggregation": "secagg"},
     "secure-aggregation='secagg' is not allowed (did you mean 'secagg+'?); allowed: off | "
     "secagg+"),
    ({"secagg-num-shares": 4}, "secagg-num-shares=4 is not allowed; allowed: an odd integer "
                               ">= 3"),
    ({"secagg-num-shares": 1}, "secagg-num-shares=1 is not allowed"),
    ({"secagg-threshold": 2}, "secagg-threshold=2 is not allowed; allowed: 3..5 (more than "
                              "half of secagg-num-shares=5"),
    ({"secagg-threshold": 6}, "secagg-threshold=6 is not allowed; allowed: 3..5"),
    ({"secagg-clip": 0.0}, "secagg-clip=0.0 is not allowed; allowed: a finite number > 0"),
    ({"secagg-clip": float("inf")}, "secagg-clip=inf is not allowed"),
    ({"secagg-bits": 0}, "secagg-bits=0 is not allowed; allowed: 1..24"),
    ({"secagg-bits": 25}, "secagg-bits=25 is not allowed; allowed: 1..24"),
])
def test_range_errors_are_one_line_whether_on_or_off(over: dict[str, object], line: str) -> None:
    assert line in refusal(over)
    if "secure-aggregation" not in over:
        assert line in refusal({**SECAGG, **over})


@pytest.mark.parametrize("method", [m for m in METHOD_NAMES if m not in secagg_methods()])
def test_each_method_that_needs_an_upload_is_refused_with_its_reason(method: str) -> None:
    extra = {"beta": 0.0} if method in ("fedrelax", "clustered") else {}
    text = refusal({**SECAGG, "method": method, **extra})
    assert f"method={method!r} is not allowed; allowed: fedavg | " in text
    assert f"with secure-aggregation='secagg+' ({method}: {METHODS[method].secagg_refusal})" \
        in text


def test_a_methods_own_spec_says_whether_it_runs_on_the_sum(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal and the allowed list both follow ``MethodSpec.secagg_refusal``."""
    monkeypatch.setattr("fedinit.methods.fedsam.SPEC",
                        dataclasses.replace(METHODS["fedsam"], secagg_refusal="a reason"))
    assert "fedsam" not in secagg_methods() and "fedavg" in secagg_methods()
    assert refusal({**SECAGG, "method": "fedsam"}) == (
        f"run config: method='fedsam' is not allowed; allowed: {' | '.join(secagg_methods())} "
        f"with secure-aggregation='secagg+' (fedsam: a reason)")


@pytest.mark.parametrize("method", [m for m in METHOD_NAMES if m in secagg_methods()])
def test_each_method_on_the_sum_is_accepted(method: str) -> None:
    assert RunConfig.parse({**SECAGG, "method": method}).privacy.secure_aggregation == "secagg+"


@pytest.mark.parametrize(("over", "line"), [
    ({"weighting": "examples"}, "weighting='examples' is not allowed; allowed: uniform with "
                                "secure-aggregation='secagg+' (the sum is divided"),
    ({"max-update-norm-ratio": 20.0}, "max-update-norm-ratio=20.0 is not allowed; allowed: 0 "
                                      "with secure-aggregation='secagg+' (the norm filter"),
    ({"aggregation": "median"}, "aggregation='median' is not allowed; allowed: mean with"),
    ({"aggregation": "trimmed-mean"}, "aggregation='trimmed-mean' is not allowed; allowed: mean"),
    ({"aggregation": "krum"}, "aggregation='krum' is not allowed; allowed: mean with"),
    ({"aggregation": "multi-krum"}, "aggregation='multi-krum' is not allowed; allowed: mean"),
    ({"aggregation": "bulyan", "num-clients": 200, "fraction-train": 0.05},
     "aggregation='bulyan' is not allowed; allowed: mean with"),
    ({"dp": "central"}, "dp='central' is not allowed; allowed: off | distributed with "
                        "secure-aggregation='secagg+' (central clips and noises each reply on "
                        "the server"),
    ({"dp": "local"}, "dp='local' is not allowed; allowed: off | distributed with"),
    ({"rounds": "async", "personal-eval-every": 0},
     "rounds='async' is not allowed; allowed: sync with secure-aggregation='secagg+'"),
    ({"fraction-train": 0.02}, "secagg-threshold=3 is not allowed; allowed: at most the "
                               "clients per round (2) with secure-aggregation='secagg+'"),
    ({"evaluation": "federated"}, "evaluation='federated' is not allowed; allowed: central, "
                                  "or auto without dataset='device' with secure-aggregation="
                                  "'secagg+' (federated evaluation sends each client's loss"),
    ({"divergence-every": 5}, "divergence-every=5 is not allowed; allowed: 0 with secure-"
                              "aggregation='secagg+' (each client would send ||w_prev_i - w_t"),
    ({"personal-eval-every": 20}, "personal-eval-every=20 is not allowed; allowed: 0 with "
                                  "secure-aggregation='secagg+' (each client would send its "
                                  "global, fine-tuned and own-model accuracies)"),
    ({"secagg-bits": 24, "num-clients": 300, "fraction-train": 1.0},
     "secagg-bits=24 is not allowed; allowed: a value with clients per round <= (2^32 - 1) "
     "// 2^bits (255 now)"),
])
def test_what_needs_one_upload_is_refused_in_one_line(over: dict[str, object],
                                                      line: str) -> None:
    assert line in refusal({**SECAGG, **over})
    RunConfig.parse({**SECAGG, **over, "secure-aggregation": "off"})  # refused for secagg only


@pytest.mark.parametrize("method", ["scaffold", "feddyn"])
def test_scaffold_and_feddyn_run_on_the_sum(method: str) -> None:
    """Their servers need only sums (SCAFFOLD's of Delta_c_i too): no longer refused."""
    assert METHODS[method].secagg_refusal is None
    assert RunConfig.parse({**SECAGG, "method": method}).method == method


def test_distributed_dp_bounds_the_quantiser_by_the_larger_of_the_two_clips() -> None:
    """SCAFFOLD's Delta_c_i is clipped to dp-clip-extra and shares the quantiser's bound."""
    ddp = {**SECAGG, "dp": "distributed", "min-replies": 3, "secagg-clip": 12.6}
    RunConfig.parse({**ddp, "method": "scaffold"})  # dp-clip-extra 0: dp-clip's bound
    line = refusal({**ddp, "method": "scaffold", "dp-clip-extra": 2.0})
    assert "secagg-clip=12.6 is not allowed; allowed: >= 25.09 with dp='distributed' " \
           "(dp-clip-extra + 20 device noise stds z dp-clip-extra / sqrt(min-replies)" in line
    RunConfig.parse({**ddp, "method": "scaffold", "dp-clip-extra": 2.0, "secagg-clip": 25.1})
    RunConfig.parse({**ddp, "method": "fedavg", "dp-clip-extra": 2.0})  # no extra upload


def test_fedcm_is_refused_where_the_server_cannot_derive_the_step_counts() -> None:
    """A masked reply carries no step count K; FedCM's d = -D / (K eta) needs it, so FedCM
    runs under SecAgg+ only where the server derives K from the partition sizes."""
    assert RunConfig.parse({**SECAGG, "method": "fedcm"}).method == "fedcm"
    line = refusal({**SECAGG, "method": "fedcm", "max-examples-per-client": 50})
    assert line.startswith("run config: method='fedcm' is not allowed; allowed: a method "
                           "other than fedcm with secure-aggregation='secagg+' when the "
                           "server cannot derive each client's step count")
    RunConfig.parse({**SECAGG, "method": "fedavg", "max-examples-per-client": 50})


@pytest.mark.parametrize(("codec", "clients", "bits", "field"), [
    ("q8", 10, 8, 16), ("q4", 10, 4, 8), ("q4", 20, 4, 16), ("off", 10, 16, 32)])
def test_q_b_under_secagg_quantises_to_b_bits_in_the_narrowest_field(
        codec: str, clients: int, bits: int, field: int) -> None:
    """The field follows the codec's bits and the round's sampled clients: 10 clients of
    8-bit values sum below 2^16 (10 * 256 = 2560), of 4-bit values below 2^8 (160), 20 of
    them not (320); without a codec, secagg-bits (16) and 10 * 2^16 need 2^32."""
    from strategies.round_stages.secure_sum import params_of

    cfg = RunConfig.parse({**SECAGG, "compression": codec, "num-clients": clients,
                           "fraction-train": 1.0, "secagg-threshold": 3})
    assert cfg.secagg_bits == bits
    params = params_of(cfg)
    assert (params.bits, params.field_bits) == (bits, field)


@pytest.mark.parametrize(("over", "line"), [
    ({"compression": "q8/64"},
     "compression='q8/64' with secure-aggregation='secagg+' is not allowed; allowed: off | q8 "
     "| q4 | q2 | q1 (a masked sum needs one quantisation grid for all clients: no top-k "
     "indices, no per-block scales)"),
    ({"compression": "topk:0.01+q8"},
     "compression='topk:0.01+q8' with secure-aggregation='secagg+' is not allowed; allowed: "
     "off | q8 | q4 | q2 | q1"),
    ({"compression": "q8", "secagg-bits": 12},
     "secagg-bits=12 is not allowed; allowed: 8 (compression='q8' quantises the masked upload "
     "to 8 bits) or its default 16"),
])
def test_what_a_codec_under_secagg_cannot_be_is_one_line(over: dict[str, object],
                                                          line: str) -> None:
    assert line in refusal({**SECAGG, **over})


def test_the_codecs_bits_given_twice_are_accepted() -> None:
    assert RunConfig.parse({**SECAGG, "compression": "q8", "secagg-bits": 8}).secagg_bits == 8
