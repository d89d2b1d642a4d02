"""How rounds are paced: ``rounds`` sync or async (FedBuff's concurrency, buffer and
staleness) and the virtual clock's ``device-speeds``."""

from __future__ import annotations

from dataclasses import dataclass

from fedinit.config.errors import bad_value


@dataclass(frozen=True)
class ScheduleConfig:
    """``rounds`` .. ``device-speeds``, typed (names: keys with '-' -> '_')."""

    rounds: str
    concurrency: int
    buffer_size: int
    staleness: str
    staleness_a: float
    staleness_b: float
    max_staleness: int
    stale_correction: str
    dc_lambda: float
    refill: str
    device_speeds: str
    task_time: str
    async_lr_scale: float = 0.0
    """a of a task's local lr eta_t (1 + tau_hat)^-a
    (``fedinit.methods.async_server_opt``); 0: off."""


def check_async_keys(s: ScheduleConfig, num_clients: int | None) -> None:
    """FedBuff's keys, checked whichever ``rounds`` (None: the client count is not known yet,
    the upper bound waits for it)."""
    if not 0 <= s.concurrency <= (s.concurrency if num_clients is None else num_clients):
        raise bad_value("concurrency", s.concurrency,
                        f"0 (the clients per round) to num-clients={num_clients}")
    for key, value, zero in (("buffer-size", s.buffer_size, "concurrency"),
                             ("max-staleness", s.max_staleness, "no limit")):
        if value < 0:
            raise bad_value(key, value, f"an integer >= 0 (0 = {zero})")
    for key, fvalue in (("staleness-a", s.staleness_a), ("staleness-b", s.staleness_b),
                        ("dc-lambda", s.dc_lambda), ("async-lr-scale", s.async_lr_scale)):
        if fvalue < 0.0:
            raise bad_value(key, fvalue, "a number >= 0")


def check_lr_scale(s: ScheduleConfig, resume_dir: str) -> None:
    """``async-lr-scale`` scales what a task is sent by the loop's counts at dispatch: an
    async-only rule, and one a resume cannot re-send yet (the checkpoint keeps no task's lr)."""
    if not s.async_lr_scale:
        return
    if s.rounds != "async":
        raise bad_value("async-lr-scale", s.async_lr_scale, "0 with rounds='sync' (a sync "
                        "round's tasks start from the newest model: no staleness to expect)")
    if resume_dir:
        raise bad_value("async-lr-scale", s.async_lr_scale, "0 with resume-dir (the "
                        "checkpoint keeps no in-flight task's scaled lr to re-send; not built)")
