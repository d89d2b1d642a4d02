"""Each method against rounds worked out by hand from the formulas of docs/algorithms.md.

Three clients (N = 3), two sampled per round (seed 3 samples clients 0 and 1 in rounds 1 and
2), f_i(w) = 0.5 * ||w - a_i||^2 so grad f_i = w - a_i, w_0 = (0, 0), K = 2 local steps of
lr 0.5: a plain step is y <- 0.5 * y + 0.5 * a_i. Every expected number below is written out
from the rules, not computed by the code under test.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from client_app.trainer import local_sgd
from fedinit.methods.fedcm import MOMENTUM
from fedinit.methods.feddyn import H_LOCAL
from fedinit.methods.fedsam import sam_gradient
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.sampling import sample_clients
from fedinit.methods.scaffold import C_GLOBAL, C_LOCAL, DELTA_C
from fedinit.store.client_store import W_PREV
from testbeds.lsq_problem import Federation, quadratic_problem

A = [[2.0, 0.0], [0.0, 4.0], [-3.0, 1.0]]
BASE = {"lr": 0.5, "local-epochs": 2, "batch-size": 1, "fraction-train": 0.67, "seed": 3}


def fed(**raw: Any) -> Federation:
    return Federation(quadratic_problem(A, [0.0, 0.0]), {**BASE, **raw})


def close(actual: Any, expected: list[float]) -> None:
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64).ravel(), expected,
                               rtol=0, atol=1e-6)


def sent(f: Federation, key: str) -> np.ndarray:
    """The extra record ``key`` of this round's first message (the same for every client)."""
    return unpack(f.sent[0].content.array_records[key])[0]


def replied(f: Federation, cid: int, key: str = "arrays") -> np.ndarray:
    msg = next(r for r in f.replies if r.metadata.src_node_id == 1000 + cid)
    return unpack(msg.content.array_records[key])[0]


def test_setup_samples_clients_0_and_1_twice() -> None:
    assert sample_clients(3, 1, 3, 2) == [0, 1] == sample_clients(3, 2, 3, 2)


def test_fedavg_two_rounds() -> None:
    f = fed(method="fedavg")
    assert f.step() == [0, 1]
    # c0: (0,0) -> (1,0) -> (1.5,0); c1: (0,0) -> (0,2) -> (0,3); mean
    close(f.weights, [0.75, 1.5])
    f.step()
    # c0 from (.75,1.5): (1.375,.75) -> (1.6875,.375); c1: (.375,2.75) -> (.1875,3.375)
    close(f.weights, [0.9375, 1.875])


@pytest.mark.parametrize("variant", ["model", "update"])
def test_fedinit_round_two_starts_from_the_relaxed_point(variant: str) -> None:
    f = fed(method="fedavg", beta=0.5, **{"ri-aggregation": variant})
    f.step()  # w_prev = w_0 = w_t: s_i = w_0, as FedAvg: w_1 = (.75, 1.5)
    close(f.weights, [0.75, 1.5])
    close(f.state_of(0, W_PREV), [1.5, 0.0])
    f.step()
    # s0 = w1 + .5(w1 - (1.5,0)) = (.375, 2.25) -> (1.1875,1.125) -> (1.59375,.5625)
    # s1 = w1 + .5(w1 - (0,3))   = (1.125, .75) -> (.5625,2.375) -> (.28125,3.1875)
    if variant == "model":
        close(replied(f, 0), [1.59375, 0.5625])
        close(replied(f, 1), [0.28125, 3.1875])
    else:  # Delta_i = y_K - s_i
        close(replied(f, 0), [1.21875, -1.6875])
        close(replied(f, 1), [-0.84375, 2.4375])
    close(f.weights, [0.9375, 1.875])  # the offsets cancel in this symmetric example
    close(f.state_of(0, W_PREV), [1.59375, 0.5625])


def test_scaffold_two_rounds_and_the_one_over_n_rule() -> None:
    f = fed(method="scaffold")
    f.step()
    close(sent(f, C_GLOBAL), [0.0, 0.0])  # c starts at zero, not at the weights
    # c_i+ = 0 - 0 + (s - y_K)/(K lr) = -(1.5,0) and -(0,3); c += (1/N) sum, N = 3 (not m = 2)
    close(f.state_of(0, C_LOCAL), [-1.5, 0.0])
    close(f.state_of(1, C_LOCAL), [0.0, -3.0])
    close(replied(f, 1, DELTA_C), [0.0, -3.0])
    close(f.weights, [0.75, 1.5])
    f.step()
    close(sent(f, C_GLOBAL), [-0.5, -1.0])
    # c0: c - c0 = (1,-1): y <- .5y + .5((2,0)-(1,-1)): (.875,1.25) -> (.9375,1.125)
    #     c0+ = (-1.5,0) - (-.5,-1) + ((.75,1.5) - (.9375,1.125)) = (-1.1875, 1.375)
    # c1: c - c1 = (-.5,2): y <- .5y + (.25,1): (.625,1.75) -> (.5625,1.875)
    #     c1+ = (0,-3) - (-.5,-1) + ((.75,1.5) - (.5625,1.875)) = (.6875, -2.375)
    close(f.state_of(0, C_LOCAL), [-1.1875, 1.375])
    close(f.state_of(1, C_LOCAL), [0.6875, -2.375])
    close(replied(f, 0, DELTA_C), [0.3125, 1.375])
    close(replied(f, 1, DELTA_C), [0.6875, 0.625])
    close(f.weights, [0.75, 1.5])
    assert f.state_of(2, C_LOCAL) is None  # never sampled: no state
    f.step()  # c = (-.5,-1) + (1/3) * (1, 2)
    close(sent(f, C_GLOBAL), [-1 / 6, -1 / 3])


def test_scaffold_with_ri_updates_c_i_from_the_start_point() -> None:
    f = fed(method="scaffold", beta=0.5, **{"ri-aggregation": "update"})
    f.step()
    f.step()
    # s0 = (.375, 2.25), c - c0 = (1,-1): (.6875,1.625) -> (.84375,1.3125)
    #   c0+ = (-1,1) + (s0 - y_K) = (-1,1) + (-.46875,.9375)
    # s1 = (1.125, .75), c - c1 = (-.5,2): (.8125,1.375) -> (.65625,1.6875)
    #   c1+ = (.5,-2) + (.46875,-.9375)
    close(f.state_of(0, C_LOCAL), [-1.46875, 1.9375])
    close(f.state_of(1, C_LOCAL), [0.96875, -2.9375])
    close(replied(f, 0, DELTA_C), [0.03125, 1.9375])
    close(replied(f, 0), [0.46875, -0.9375])
    close(f.weights, [0.75, 1.5])  # w1 + mean(Delta_i)


def test_feddyn_two_rounds() -> None:
    f = fed(method="feddyn", **{"feddyn-alpha": 1.0})
    # grad: (y - a) + (y - s) + h, so y <- .5 * (a + s - h) from the first step on
    f.step()  # y0 = (1,0), y1 = (0,2); h = Delta; H = (1,2); w1 = (.5,1) + H/3
    close(f.state_of(0, H_LOCAL), [1.0, 0.0])
    close(f.weights, [5 / 6, 5 / 3])
    f.step()
    # y0 = .5((2,0) + (5/6,5/3) - (1,0)) = (11/12, 5/6); Delta0 = (1/12, -5/6)
    # y1 = .5((0,4) + (5/6,5/3) - (0,2)) = (5/12, 11/6); Delta1 = (-5/12, 1/6)
    close(f.state_of(0, H_LOCAL), [13 / 12, -5 / 6])
    close(f.state_of(1, H_LOCAL), [-5 / 12, 13 / 6])
    # H = (1,2) + (-1/3,-2/3) = (2/3, 4/3); w2 = mean(y) + H/3 = (2/3,4/3) + (2/9,4/9)
    close(f.weights, [8 / 9, 16 / 9])


def test_fedprox_two_rounds() -> None:
    f = fed(method="fedprox", **{"prox-mu": 1.0})
    f.step()  # grad (y - a) + (y - s): y <- .5 * (a + s) = (1,0), (0,2)
    close(f.weights, [0.5, 1.0])
    f.step()  # .5 * ((2,0) + (.5,1)) = (1.25,.5); .5 * ((0,4) + (.5,1)) = (.25,2.5)
    close(f.weights, [0.75, 1.5])


def test_fedadam_one_round_without_bias_correction() -> None:
    f = fed(method="fedadam", **{"server-lr": 0.1})
    f.step()
    # D = (.75,1.5); m = .1 D = (.075,.15); v = .01 D^2, sqrt(v) = (.075,.15)
    # w1 = .1 * m / (sqrt(v) + .01) = .1 * (.075/.085, .15/.16)
    close(f.weights, [0.0882352941, 0.09375])
    f.step()
    # c0 from w1: (1.0441176, .046875) -> (1.5220588, .0234375)
    # c1 from w1: (.0441176, 2.046875) -> (.0220588, 3.0234375)
    # D = mean - w1 = (.6838235, 1.4296875)
    # m = .9 m + .1 D = (.1358824, .2779688); v = .99 v + .01 D^2 = (.0102449, .0427151)
    # w2 = w1 + .1 * m / (sqrt(v) + .01) = w1 + (.1221776, .1282876)
    close(f.weights, [0.2104129, 0.2220376])


def test_fedcm_two_rounds_with_a_decaying_lr() -> None:
    f = fed(method="fedcm", **{"fedcm-alpha": 0.5, "lr-decay": 0.5})
    f.step()
    close(sent(f, MOMENTUM), [0.0, 0.0])  # no momentum in round 1
    # step y -= .5 * (.5 (y - a)): y <- .75y + .25a; c0: (.5,0) -> (.875,0); c1: (0,1) -> (0,1.75)
    close(f.weights, [0.4375, 0.875])
    f.step()
    # d = -D / (K lr_1) = -(.4375,.875) / (2 * .5)
    close(sent(f, MOMENTUM), [-0.4375, -0.875])
    # lr_2 = .25: y <- y - .25 * (.5 (y - a) + .5 d) = .875y + .125 (a - d)
    # c0: (.6875,.875) -> (.90625,.875); c1: (.4375,1.375) -> (.4375,1.8125)
    close(f.weights, [0.671875, 1.34375])
    f.step()  # d = -(w2 - w1) / (2 * .25)
    close(sent(f, MOMENTUM), [-0.46875, -0.9375])


def test_fedcm_steps_are_averaged_with_the_weights_of_d() -> None:
    """Unequal clients: c0 holds a_0 twice (K=2), c1 holds a_1 once (K=1); both sampled."""
    problem = quadratic_problem([A[0], A[1]], [0.0, 0.0])
    problem.xs[0] = torch.tensor([A[0], A[0]], dtype=torch.float32)
    problem.ys[0] = torch.zeros(2)
    f = Federation(problem, {**BASE, "local-epochs": 1, "fraction-train": 1.0,
                             "method": "fedcm", "fedcm-alpha": 0.5})
    f.step()
    # y <- .75y + .25a: c0 (0,0) -> (.5,0) -> (.875,0); c1 (0,0) -> (0,1)
    # D = (2 (.875,0) + 1 (0,1)) / 3 = (.5833333, .3333333); K = (2*2 + 1*1) / 3 = 5/3
    close(f.weights, [0.5833333, 0.3333333])
    f.step()
    # d = -D / (K lr) = -(.5833333, .3333333) / (5/3 * .5) = (-.7, -.4); an unweighted
    # K = 1.5 would give (-.7777778, -.4444444)
    close(sent(f, MOMENTUM), [-0.7, -0.4])
    f_uniform = Federation(problem, {**BASE, "local-epochs": 1, "fraction-train": 1.0,
                                     "method": "fedcm", "fedcm-alpha": 0.5,
                                     "weighting": "uniform"})
    f_uniform.step()
    # uniform: D = ((.875,0) + (0,1)) / 2, K = 1.5: d = -D / .75
    f_uniform.step()
    close(sent(f_uniform, MOMENTUM), [-0.5833333, -0.6666667])


def test_fedsam_one_round() -> None:
    f = fed(method="fedsam", **{"sam-rho": 1.0})
    f.step()
    # c0: g = (-2,0), ascend to (-1,0), gradient there (-3,0): y1 = (1.5,0)
    #     g = (-.5,0), ascend to (.5,0), gradient (-1.5,0): y2 = (2.25,0)
    # c1: g = (0,-4) -> (0,-5): y1 = (0,2.5); g = (0,-1.5) -> (0,-2.5): y2 = (0,3.75)
    close(f.weights, [1.125, 1.875])


class TwoScalars(nn.Module):
    """Two parameter tensors, so a norm taken per tensor would show."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.zeros(1))
        self.b = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.a, self.b]) - x[0]


def sq(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 0.5 * torch.sum(out**2)


def one_step(**kw: Any) -> tuple[list[float], float]:
    model = TwoScalars()
    x, y = torch.tensor([[3.0, 4.0]]), torch.zeros(1)
    res = local_sgd(model, x, y, epochs=1, batch_size=1, lr=kw.pop("lr", 0.5), weight_decay=0.0,
                    generator=torch.Generator().manual_seed(0), loss_fn=sq, **kw)
    return [float(model.a.detach()), float(model.b.detach())], res.mean_loss


def test_sam_ascends_along_the_whole_gradient_and_reports_the_unperturbed_loss() -> None:
    w, loss = one_step(clip_norm=0.0, gradient=sam_gradient(1.0))
    # g = (-3,-4), ||g|| = 5: ascend to (-.6,-.8), gradient (-3.6,-4.8); step .5
    close(w, [1.8, 2.4])
    assert loss == pytest.approx(12.5)  # 0.5 * (9 + 16) at the original point


def test_the_hook_acts_before_clipping() -> None:
    def hook(params: list[torch.Tensor]) -> None:
        params[0].grad.add_(6.0)  # type: ignore[union-attr]
        params[1].grad.add_(8.0)  # type: ignore[union-attr]

    w, _ = one_step(clip_norm=1.0, lr=1.0, hook=hook)
    # (-3,-4) + (6,8) = (3,4), clipped to norm 1: (.6,.8); step lr 1.
    # (A hook after clipping would give (-.6,-.8) + (6,8) and w = (-5.4,-7.2).)
    close(w, [-0.6, -0.8])


@pytest.mark.parametrize("ratio", [20.0, 0.6])
def test_fedavg_with_lr_decay_clipping_and_the_norm_filter(ratio: float) -> None:
    """The harness with everything a real run has on: lr decay, gradient clipping and the norm
    filter (its reference: this round's norms and the accepted ones before)."""
    from fedinit.methods import wire as rk

    f = fed(method="fedavg", **{"lr-decay": 0.5, "clip-norm": 1.0,
                                "max-update-norm-ratio": ratio})
    f.step()
    # every gradient (y - a) has norm > 1: clipped to unit length along a - y, step lr_1 = .5
    # c0: (0,0) -> (.5,0) -> (1,0); c1: (0,0) -> (0,.5) -> (0,1). Moves of norm 1 each; w_0 = 0
    # gives no first-round bound, so both are accepted.
    close(f.weights, [0.5, 0.5])
    assert f.metrics[-1][rk.NUM_REJECTED] == 0
    f.step()
    # lr_2 = .25, unit steps toward a_i: each client moves .5 along (a_i - w_1)/||a_i - w_1||
    u0 = np.array([1.5, -0.5]) / np.sqrt(2.5)
    u1 = np.array([-0.5, 3.5]) / np.sqrt(12.5)
    # norm limit: ratio x median(.5, .5 this round; 1, 1 accepted before) = ratio x .75
    if ratio * 0.75 >= 0.5:
        close(f.weights, 0.5 + 0.5 * (u0 + u1) / 2)
        assert f.metrics[-1][rk.NUM_REJECTED] == 0
        assert f.metrics[-1][rk.NORM_LIMIT_USED] == pytest.approx(0.5 / (ratio * 0.75))
    else:  # both moves are over the limit: no usable reply, the model stays
        close(f.weights, [0.5, 0.5])
        assert f.metrics[-1][rk.NUM_REJECTED] == 2
