"""The train round as a pipeline, built once per run: the one place that reads whether DP is
on (the sampler, whether the norm filter or the DP stage is present, the quorum's count, the
denominator, the reply placeholders and the train-loss metric follow from it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from fedinit.config import RunConfig
from fedinit.methods.dp import Mechanism
from fedinit.methods.robust_choices import SELECTIONS
from strategies.round_stages.combine import Combine, RobustMean
from strategies.round_stages.decode import DecodeReplies
from strategies.round_stages.held import AccountedRounds, HeldMethod
from strategies.round_stages.messages import ClientConfig, TrainMessages
from strategies.round_stages.method_update import AccountRound, MethodUpdate
from strategies.round_stages.norm_filter import NormFilter
from strategies.round_stages.quorum import MinReplies
from strategies.round_stages.replies import RoundReplies, Stage, run_stages
from strategies.round_stages.sampling import (
    AvailableSampler,
    RegisteredSampler,
    Sampler,
    secret_seed,
)

if TYPE_CHECKING:  # the stages a run's settings may leave out load when they are built
    from strategies.round_stages.secure_sum import SecAggRound


@dataclasses.dataclass(frozen=True)
class TrainPipeline:
    """Who is asked (``sampler``), what they are sent (``messages``), and the stages their
    replies pass through, in order."""

    sampler: Sampler
    messages: TrainMessages
    stages: tuple[Stage, ...]
    secure: SecAggRound | None = None
    """The SecAgg+ round in flight (``secure-aggregation=secagg+``): ``configure_train`` runs
    its key exchange, the ``SecureSum`` stage its unmask exchange. None when off."""

    def __call__(self, replies: RoundReplies) -> RoundReplies:
        return run_stages(self.stages, replies)

    def stage(self, kind: type) -> Stage | None:
        """The pipeline's stage of class ``kind``, or None when absent."""
        return next((s for s in self.stages if isinstance(s, kind)), None)

    def inserted(self, stage: Stage, *, before: type) -> TrainPipeline:
        """This pipeline with ``stage`` right before its stage of class ``before``;
        ValueError naming the classes present when there is none."""
        kinds = [type(s) for s in self.stages]
        if before not in kinds:
            raise ValueError(f"before={before.__name__} is not a stage of this pipeline; "
                             f"allowed: {', '.join(k.__name__ for k in kinds)}")
        i = kinds.index(before)
        return dataclasses.replace(self, stages=(*self.stages[:i], stage, *self.stages[i:]))


def build_train_pipeline(cfg: RunConfig, method: HeldMethod, accounted: AccountedRounds,
                         node_of_partition: Mapping[int, int], client_config: ClientConfig,
                         examples: Sequence[int] | None) -> TrainPipeline:
    """The run's pipeline: decode -> norm filter (not under DP) -> quorum -> selection (Krum,
    Multi-Krum, Bulyan) -> DP (only under DP) -> combine -> method update -> accounting.
    Under DP the sample is drawn from a secret seed (the run's seed is public). Under secure
    aggregation: decode (masked uploads) -> quorum -> secure sum -> method update ->
    accounting: nothing else may read one upload (``fedinit.config`` refuses what does); with
    ``dp=distributed`` the sampler is DP's and the secure sum releases only sums of at least
    t_min uploads, divided by the fixed m."""
    messages = TrainMessages(cfg, method, node_of_partition, client_config)
    counts = None if examples is None else tuple(int(n) for n in examples)
    privacy = Mechanism.from_config(cfg)
    dp = privacy.on
    sampler: Sampler = (
        RegisteredSampler(secret_seed(), cfg.num_clients, cfg.clients_per_round) if dp
        else AvailableSampler(cfg.seed, cfg.num_clients, cfg.sampled_per_round))
    if cfg.privacy.secure_aggregation != "off":
        from strategies.round_stages.secure_sum import (
            SecAggRound,
            SecureSum,
            params_of,
            upload_keys,
        )

        # dp=distributed (the only DP mode allowed here): the devices clip and noise, the
        # server adds nothing; the quorum counts the uploads in the sum (t_min = min-replies),
        # the mean divides by the fixed m as central does
        params = params_of(cfg)
        session = SecAggRound(params, timeout=cfg.fleet.round_timeout,
                              extra_keys=upload_keys(method.rule.up_keys), private=dp)
        secure_sum = (SecureSum(session, denominator=privacy.expected_clients,
                                min_survivors=privacy.noise_shares) if dp
                      else SecureSum(session))
        return TrainPipeline(
            sampler, messages,
            (DecodeReplies(cfg, method.rule, counts, secagg=params),
             MinReplies(cfg.fleet.min_replies), secure_sum,
             MethodUpdate(cfg, method, RobustMean(cfg)),
             AccountRound(accounted, train_loss=False)),  # no client's loss is known
            secure=session)
    rule = method.rule
    robust = RobustMean(cfg)
    stages: list[Stage] = [DecodeReplies(cfg, rule, counts,
                                         placeholders=privacy.mode == "local")]
    if not dp:
        stages.append(NormFilter(cfg, method))
    stages.append(MinReplies(cfg.fleet.min_replies, count_arrived=dp))
    if cfg.robust.aggregation in SELECTIONS:
        from strategies.round_stages.selection import RobustSelection
        stages.append(RobustSelection(cfg, rule))
    if dp:
        from strategies.round_stages.privacy import ClientLevelDp
        stages.append(ClientLevelDp(privacy, rule.up_keys))
    stages += [Combine(cfg.train.ri_aggregation, cfg.train.weighting,
                       privacy.mean if dp else robust),
               MethodUpdate(cfg, method, robust),
               AccountRound(accounted, train_loss=privacy.mode != "local")]
    return TrainPipeline(sampler, messages, tuple(stages))
