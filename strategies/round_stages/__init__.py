"""The server's train round as separate stages that ``strategies.method_strategy.MethodStrategy``
(the thin Flower adapter) runs in order: sample -> messages -> reply decoding and checks ->
norm filter (owning its history) -> quorum -> robust selection -> DP -> combine -> method
update -> accounting. Each stage is a function of ``RoundReplies`` (``replies.py``);
``pipeline.build_train_pipeline`` composes them once per run, the one place that reads
whether DP is on. A new stage (secure aggregation, buffering for asynchronous rounds) is one
more module and one line there (or ``TrainPipeline.inserted``), not a branch in the others."""

from strategies.round_stages.pipeline import TrainPipeline, build_train_pipeline
from strategies.round_stages.replies import RoundReplies, Stage, run_stages

__all__ = ["RoundReplies", "Stage", "TrainPipeline", "build_train_pipeline", "run_stages"]
