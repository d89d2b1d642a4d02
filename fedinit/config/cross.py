"""Cross-group checks: rules between keys of different groups (a robust rule against the round
size, DP or secure aggregation against the method, the evaluation and the data, async rounds
against everything they cannot run with yet). Each refusal is one line naming one key."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedinit.config.choices import check_model_input
from fedinit.config.errors import ConfigError, bad_value
from fedinit.config.shown import shown
from fedinit.data_sets import spec_of
from fedinit.methods.dp import CLIP_SIGMAS, min_secagg_clip
from fedinit.methods.dp import refusal as dp_refusal
from fedinit.methods.registry import METHODS, async_methods, secagg_methods
from fedinit.methods.robust_choices import min_replies

if TYPE_CHECKING:  # annotations only: run_config imports these checks
    from fedinit.config.run_config import RunConfig


def check_device_cap(c: RunConfig) -> None:
    """``dataset=device``: the server cannot count examples, so a reply's claim is capped."""
    if c.robust.max_examples_per_client == 0:
        raise bad_value("max-examples-per-client", 0,
                        "a cap > 0 when dataset='device' (the server cannot count the examples "
                        "a device holds, so it caps each reply's claimed weight)")


def check_model_fits(c: RunConfig) -> None:
    """The model takes the data set's images (the device schema's with ``dataset=device``)."""
    schema = spec_of(c.data.dataset).schema
    size = c.data.device_image_size if schema is None else schema.image_size
    try:
        check_model_input(c.train.model, size)
    except ValueError as err:
        raise ConfigError(f"run config: model={c.train.model!r} does not fit "
                          f"dataset={c.data.dataset!r}: {err}") from None


def check_robust(c: RunConfig, sized: bool = True) -> None:
    """``byzantine-f`` against the round size (when ``sized``; under ``rounds=async`` the
    buffer's, ``check_async``), and methods whose state a robust rule breaks."""
    r = c.robust
    need = min_replies(r.aggregation, r.byzantine_f)
    if sized and c.schedule.rounds == "sync" and c.clients_per_round < need:
        rule = "n >= 4f + 3" if r.aggregation == "bulyan" else "n > 2f + 2"
        raise bad_value("byzantine-f", r.byzantine_f,
                        f"at most what aggregation={r.aggregation!r} tolerates in "
                        f"{c.clients_per_round} clients per round ({rule}, n = clients per "
                        f"round)")
    refusal = METHODS[c.method].server.robust_refusal
    if r.aggregation != "mean" and refusal:
        raise bad_value("aggregation", r.aggregation,
                        f"mean with method={c.method!r} ({refusal})")


def check_per_client(c: RunConfig) -> None:
    """RI and DP with a method whose clients each get their own model (FedRelax, clustered
    FL: ``ServerRule.per_client_refusal``) are refused with the method's reason."""
    refusal = METHODS[c.method].server.per_client_refusal
    if not refusal:
        return
    t, dp = c.train, c.privacy.dp
    for key, value, ok, allowed in (("beta", t.beta, t.beta == 0.0, "0"),
                                    ("ri-aggregation", t.ri_aggregation,
                                     t.ri_aggregation != "update", "auto or model"),
                                    ("dp", dp, dp == "off", "off")):
        if not ok:
            raise bad_value(key, value, f"{allowed} with method={c.method!r} ({refusal})")


def check_min_replies(c: RunConfig) -> None:
    """A round cannot need more replies than it samples."""
    if c.fleet.min_replies > c.clients_per_round:
        raise bad_value("min-replies", c.fleet.min_replies,
                        f"at most the clients per round ({c.clients_per_round})")


def check_personal_needs_split(c: RunConfig) -> None:
    """Personalized evaluation needs local test splits."""
    if c.eval.personal_eval_every > 0 and c.data.local_test_fraction == 0.0:
        raise bad_value("personal-eval-every", c.eval.personal_eval_every,
                        "0 while local-test-fraction=0 (clients have no local test split)")


def check_evaluation(c: RunConfig) -> None:
    """Central evaluation needs the data set on the server; federated needs local tests."""
    if c.eval.evaluation == "central" and c.data.on_devices:
        raise bad_value("evaluation", c.eval.evaluation, "federated or auto when "
                        "dataset='device' (the server holds no test set)")
    if c.eval_source == "federated" and c.data.local_test_fraction == 0.0:
        raise bad_value("local-test-fraction", c.data.local_test_fraction,
                        "> 0 with federated evaluation (the clients evaluate on their local "
                        "test splits)")


def check_dp_refusal(c: RunConfig) -> None:
    """The settings DP cannot run with: the method's own (``ServerRule.dp_refusal``), then
    the run's (``fedinit.methods.dp.refusal``)."""
    if c.privacy.dp == "off":
        return
    why = METHODS[c.method].server.dp_refusal
    if why:
        raise bad_value("dp", c.privacy.dp, f"off with method={c.method!r} ({why})")
    refused = dp_refusal(c.privacy.dp, c.train.ri_aggregation, c.train.weighting,
                         c.robust.aggregation)
    if refused is not None:
        raise bad_value(*refused)


def check_async(c: RunConfig, sized: bool = True) -> None:
    """What ``rounds=async`` cannot run yet, each refused with its reason (a method's own:
    ``MethodSpec.async_refusal``). Not ``sized``: the bounds that read the client count, or
    a buffer size that defaults to the round size, wait for the parse that has it."""
    if c.schedule.rounds == "sync":
        return
    why = METHODS[c.method].async_refusal
    if why is not None:
        raise bad_value("method", c.method, f"{' | '.join(async_methods())} with "
                        f"rounds='async' ({c.method}: {why})")
    dp, s, r, e = c.privacy.dp, c.schedule, c.robust, c.eval
    need = min_replies(r.aggregation, r.byzantine_f)
    rule = METHODS[c.method].server
    own = rule.async_refusal(dict(c.method_values))
    if own is not None:
        key, value, allowed, why = own
        raise bad_value(key, value, f"{allowed} with rounds='async' ({why})")
    refusals = (
        ("dp", dp, dp != "local", "off | central",
         "each upload is a release when the device sends it, also one dropped as stale or "
         "never flushed, and a client may upload more than once between flushes: the "
         "server's per-flush count would understate it"),
        ("dp", dp, dp != "distributed", "off | central",
         "distributed DP needs secure aggregation, which is sync only"),
        ("buffer-size", s.buffer_size,
         not sized or dp == "off" or c.async_buffer_size <= c.num_clients,
         f"at most num-clients={c.num_clients} with dp={dp!r}",
         "a client contributes at most once per flush"),
        ("aggregation", r.aggregation, r.aggregation == "mean" or not
         METHODS[c.method].server.up_keys, f"mean with method={c.method!r}",
         "its clients' state is accounted when a reply is buffered, before a robust rule "
         "decides whether it is kept; not built"),
        ("buffer-size", s.buffer_size,
         c.async_buffer_size >= need or not (sized or s.buffer_size or s.concurrency),
         f"at least {need} (0: concurrency="
         f"{c.async_concurrency if sized or s.concurrency else 'the clients per round'}) with "
         f"aggregation={r.aggregation!r} and byzantine-f={r.byzantine_f}",
         "the rule runs over the K buffered replies: "
         + ("n >= 4f + 3" if r.aggregation == "bulyan" else "n > 2f + 2")),
        ("staleness", s.staleness, not rule.replaces_models or s.staleness == "constant",
         f"constant with method={c.method!r}",
         "a reply replaces its client's model at the flush: no step for s(tau) to weight; "
         "max-staleness still drops a staler reply"),
        ("stale-correction", s.stale_correction, s.stale_correction == "off" or dp == "off",
         "off with dp=" + repr(dp), "the correction depends on the clipped Delta, so a "
         "corrected reply's norm is no longer bounded by dp-clip"),
        ("stale-correction", s.stale_correction,
         s.stale_correction == "off" or not rule.replaces_models,
         f"off with method={c.method!r}", "a reply replaces its client's model at the flush: "
         "no step to correct"),
        ("evaluation", e.evaluation, c.eval_source == "central", "auto or central",
         "federated evaluation beside in-flight training is not built yet"),
        ("personal-eval-every", e.personal_eval_every, e.personal_eval_every == 0, "0",
         "personalized evaluation is not run between flushes yet"),
        ("divergence-every", e.divergence_every, e.divergence_every == 0, "0",
         "the all-client divergence is not run between flushes yet"),
    )
    for key, value, ok, allowed, why in refusals:
        if not ok:
            raise bad_value(key, value, f"{allowed} with rounds='async' ({why})")


def check_over_select(c: RunConfig, sized: bool = True) -> None:
    """With o > 0, ceil(m (1 + o)) clients must exist (when ``sized``), and what reads who
    was sampled or needs every sampled reply is refused, each in one line."""
    o = c.fleet.over_select
    if o == 0.0:
        return
    k = c.sampled_per_round
    if sized and k > c.num_clients:
        most = shown(c.num_clients / c.clients_per_round - 1, o)[0]
        raise bad_value("over-select", o, f"at most {most} "
                        f"(ceil(m (1 + o)) = {k} clients > num-clients={c.num_clients})")
    for key, value, ok, allowed, why in (
        ("dp", c.privacy.dp, c.privacy.dp == "off", "off",
         "the accountant's amplification by sampling assumes each client is in a round's sum "
         "with rate m/N; which m of m(1+o) are summed depends on their speed, not on a secret "
         "draw"),
        ("rounds", c.schedule.rounds, c.schedule.rounds == "sync", "sync",
         "asynchronous rounds never wait for a sample; concurrency sets how many train"),
        ("secure-aggregation", c.privacy.secure_aggregation,
         c.privacy.secure_aggregation == "off", "off",
         "the key exchange fixes who is in the sum before training; the late ones would be "
         "dropouts to unmask"),
    ):
        if not ok:
            raise bad_value(key, value, f"{allowed} with over-select={o:g} ({why})")


def check_secagg(c: RunConfig, sized: bool = True) -> None:
    """What needs one client's upload, which the server never sees under secure aggregation,
    each refused in one line; the bounds against the round size only when ``sized``."""
    p = c.privacy
    if p.secure_aggregation == "off":
        return
    with_it = f"with secure-aggregation={p.secure_aggregation!r}"
    why = METHODS[c.method].secagg_refusal
    if why is not None:
        raise bad_value("method", c.method, f"{' | '.join(secagg_methods())} {with_it} "
                        f"({c.method}: {why})")
    t, r, e = p.secagg_threshold, c.robust, c.eval
    bits = c.secagg_bits  # the codec's under compression=qB
    max_clients = (2**32 - 1) // 2**bits
    for key, value, ok, allowed, why in (
        ("weighting", c.train.weighting, c.train.weighting == "uniform", "uniform",
         "the sum is divided by the survivors; example weighting would need each count masked"),
        ("max-update-norm-ratio", r.max_update_norm_ratio, r.max_update_norm_ratio == 0.0, "0",
         "the norm filter reads each upload's norm"),
        ("aggregation", r.aggregation, r.aggregation == "mean", "mean",
         "median, trimmed-mean, krum, multi-krum and bulyan read each upload"),
        ("dp", p.dp, p.dp in ("off", "distributed"), "off | distributed",
         "central clips and noises each reply on the server, which never sees one; local "
         "noises each upload in full, the sum then carries m times the noise it needs"),
        ("rounds", c.schedule.rounds, c.schedule.rounds == "sync", "sync",
         "a buffer of replies from different rounds has no common key exchange"),
        ("secagg-threshold", t, not sized or t <= c.clients_per_round,
         f"at most the clients per round ({c.clients_per_round})",
         "fewer clients than the threshold can never unmask a sum"),
        ("secagg-bits", bits, not sized or c.clients_per_round <= max_clients,
         f"a value with clients per round <= (2^32 - 1) // 2^bits ({max_clients} now)",
         "the quantised sum would wrap around 2^32"),
        # the evaluations answer per client: under secure aggregation the server learns sums
        ("evaluation", e.evaluation, c.eval_source == "central",
         "central, or auto without dataset='device'",
         "federated evaluation sends each client's loss, accuracy and test-split size, and "
         "the server holds no test set with dataset='device'"),
        ("divergence-every", e.divergence_every, e.divergence_every == 0, "0",
         "each client would send ||w_prev_i - w_t||^2 and whether it has trained"),
        ("personal-eval-every", e.personal_eval_every, e.personal_eval_every == 0, "0",
         "each client would send its global, fine-tuned and own-model accuracies"),
    ):
        if not ok:
            raise bad_value(key, value, f"{allowed} {with_it} ({why})")
    if c.method == "fedcm" and (c.data.on_devices or r.max_examples_per_client > 0):
        raise bad_value("method", c.method, f"a method other than fedcm {with_it} when the "
                        f"server cannot derive each client's step count (dataset='device' or "
                        f"max-examples-per-client > 0: a masked reply carries no step count, "
                        f"and FedCM's d = -D / (K eta) needs K)")
    if p.dp == "distributed":
        check_distributed_dp(c, sized)


def check_distributed_dp(c: RunConfig, sized: bool = True) -> None:
    """``dp=distributed``: t_min = ``min-replies`` is the fewest uploads a released sum holds
    (each device adds 1/t_min of the noise's variance); a released SecAgg+ sum already holds
    at least ``secagg-threshold`` uploads, so t_min below it only adds noise. The quantiser's
    bound c must sit ``CLIP_SIGMAS`` device noise stds above C (a clip at c is then a 5.5e-89
    event per coordinate)."""
    p = c.privacy
    t, t_min = p.secagg_threshold, c.fleet.min_replies
    if t_min < t:
        m = f" ({c.clients_per_round})" if sized else ""
        raise bad_value("min-replies", t_min, f"secagg-threshold ({t}) to the clients per round"
                        f"{m} with dp='distributed' (min-replies is t_min: "
                        f"each device adds 1/t_min of the noise's variance, and a released sum "
                        f"already holds at least secagg-threshold uploads)")
    # a method's extra uploads (SCAFFOLD's Delta_c_i) share the quantiser: the larger bound
    extra = METHODS[c.method].server.up_keys and (p.dp_clip_extra or p.dp_clip) > p.dp_clip
    clip, name = ((p.dp_clip_extra, "dp-clip-extra") if extra else (p.dp_clip, "dp-clip"))
    low = min_secagg_clip(clip, p.dp_noise_multiplier, t_min)
    if p.secagg_clip < low:
        least = shown(low, p.secagg_clip, least=4)[0]
        raise bad_value("secagg-clip", p.secagg_clip, f">= {least} with dp='distributed' "
                        f"({name} + {CLIP_SIGMAS:g} device noise stds z {name} / "
                        f"sqrt(min-replies), so a noised coordinate is almost never clipped at "
                        f"secagg-clip)")


def check_speeds_on_devices(c: RunConfig) -> None:
    """The virtual clock needs each client's example count, which a device does not tell."""
    if c.data.on_devices and c.schedule.device_speeds != "off":
        raise bad_value("device-speeds", c.schedule.device_speeds, "off with dataset='device' "
                        "(the server cannot count a device's examples, so a task has no "
                        "simulated duration)")
