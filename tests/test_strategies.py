"""``strategies``: the methods as Flower strategies for any app, and their client half.

Server: each class is a Flower ``Strategy``; driven by Flower's own ``Strategy.start`` on the
in-process grid (the project's ClientApp on every node) it trains the model the project's
own run of the same config trains, bit for bit; bad arguments fail with the run config's
one-line errors, named by the arguments. Client: ``method_train`` on a least-squares
problem matches an independent numpy computation of RI's start, SCAFFOLD's c_i and FedDyn's
h_i, including the accounted-round rule; every class trains a user's app in process; and
``participate`` with the project's own SGD pass replies what the project's ``client_round``
does, bit for bit (the project's ClientApp runs this API).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp.strategy import Strategy
from torch import nn

from client_app.round import client_round
from client_app.trainer import SgdSettings, sgd_pass
from fedinit.cli.inprocess_grid import InProcessGrid, LocalGrid, set_task_identity
from fedinit.config import ConfigError, RunConfig
from fedinit.flower_compat.app_source import app_files
from fedinit.methods import wire as rk
from fedinit.methods.dp import Mechanism
from fedinit.methods.feddyn import H_LOCAL
from fedinit.methods.packed_arrays import pack, unpack
from fedinit.methods.registry import METHOD_NAMES, METHODS
from fedinit.methods.scaffold import C_GLOBAL, C_LOCAL, DELTA_C
from fedinit.store.client_store import W_PREV, ClientStore
from fedinit.task.models import initial_weights
from server_app.experiment import run_experiment
from strategies import FedDyn, FedInit, Scaffold
from strategies.catalog import STRATEGIES
from strategies.client import method_train, participate, stored_state
from strategies.wire import method_config
from tests.test_layers import project_imports

pytestmark = pytest.mark.usefixtures("quick_runs")

REPO = Path(__file__).resolve().parents[1]
SMALL = {"num-clients": 4, "fraction-train": 0.5, "num-server-rounds": 3, "train-limit": 800,
         "local-epochs": 1, "personal-eval-every": 0, "eval-every": 3}


@pytest.mark.slow  # a fresh interpreter importing torch and the apps: 11-23 s
def test_a_fresh_interpreter_imports_the_classes_and_the_client_half_alone() -> None:
    code = ("import sys\nimport strategies.client\n"
            "client_only = sorted(m for m in sys.modules if m.startswith('server_app'))\n"
            "from strategies import FedInit, Scaffold, FedDyn\n"
            "from flwr.serverapp.strategy import Strategy\n"
            "print(client_only, all(issubclass(c, Strategy) for c in (FedInit, Scaffold, "
            "FedDyn)))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert out.strip() == "[] True"


SERVER_HALF_MODULES = 38
"""The project's modules ``FedInit(...)`` loads: the run config's checks, the method's rules
and the adapter, not the round engine (``start()`` loads ``MethodStrategy`` and its stages).
105 before the SecAgg+ protocol, the data modules and torch were taken off its path; 93 before
the method registry imported a method's module on first use; 79 before the pipeline built the
secure sum, robust selection and DP stages only for a run that has them; 73 before the
constructor left ``MethodStrategy`` to ``start()`` (45), the data-set registry loaded a data
set's module on first use (39) and the config checks loaded ``device_speeds`` and
``async_server_opt`` only for a run that sets their key (37; 38 with ``fedinit.lazy``, the
one home of the loading on first use); issue 43 asks for at most 45."""
CLIENT_HALF_MODULES = 31
"""The project's modules ``strategies.client`` loads (the SecAgg+ protocol only when a round
asks for it: its wire names here, its client in ``strategies.secure_upload``; a method's
rules when a round names it): 45 before the method registry loaded lazily; the run config's
package itself since the choices live there (``fedinit.config``, its groups not loaded);
30 before ``fedinit.lazy``, the one home of the loading on first use."""


def _loaded(code: str) -> tuple[list[str], set[str]]:
    """The project's modules and which of torch / torchvision a fresh interpreter has after
    ``code``."""
    probe = (f"import sys\n{code}\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "{'strategies', 'server_app', 'client_app', 'fedinit'}))\n"
             "print(sorted({'torch', 'torchvision'} & set(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=True).stdout.splitlines()
    return ast.literal_eval(out[0]), set(ast.literal_eval(out[1]))


@pytest.mark.slow  # two fresh interpreters
def test_each_half_loads_only_what_it_needs() -> None:
    """The server half builds a strategy without torch, the data loaders, the SecAgg+
    protocol or the round engine (``start()`` loads it), and the engine of a plain run
    without the data modules, the device speeds, the robust rules or the patch installer; the
    client half without torchvision or the server."""
    server, heavy = _loaded("from strategies import FedInit\nFedInit(beta=0.1, lr=0.05)")
    assert heavy == set(), heavy
    assert not any(m.startswith(("fedinit.secure_aggregation", "fedinit.task", "client_app",
                                 "fedinit.data_sets.cifar", "fedinit.config.device_speeds",
                                 "strategies.method_strategy", "strategies.round_stages"))
                   for m in server), server
    assert len(server) <= SERVER_HALF_MODULES, (len(server), server)
    engine, heavy = _loaded(  # what start() adds for a plain run: no data, speeds, robust
        "import numpy as np\nfrom fedinit.config import RunConfig\n"
        "from strategies.schedules import run_sync\n"
        "from strategies.method_strategy import MethodStrategy\n"
        "MethodStrategy(RunConfig.parse({'num-clients': 4}), {i: i for i in range(4)},\n"
        "               [np.zeros(2, np.float32)], examples=None)")
    assert heavy == set(), heavy
    assert not {"fedinit.task.federated_data", "fedinit.data_sets.cifar10",
                "fedinit.config.device_speeds", "fedinit.methods.robust",
                "fedinit.methods.async_server_opt", "fedinit.flower_compat.installer",
                "fedinit.secure_aggregation"} & set(engine), engine
    client, heavy = _loaded("from strategies.client import method_train")
    assert heavy == {"torch"}, heavy
    assert not any(m.startswith(("server_app", "strategies.base")) for m in client), client
    assert len(client) <= CLIENT_HALF_MODULES, (len(client), client)


def test_one_class_per_method_each_a_flower_strategy() -> None:
    assert {cls.method for cls in STRATEGIES} == set(METHOD_NAMES)
    for cls in STRATEGIES:
        assert isinstance(cls(lr=0.05), Strategy)


def test_the_layers_strategies_import() -> None:
    """The client half sits below the apps (a ClientApp may import it); the engine and the
    server classes import no app either (``server_app`` is the experiment over them)."""
    allowed = {"wire.py": {"methods"},
               "client.py": {"methods", "store", "task", "secure_aggregation"},
               "secure_upload.py": {"methods", "secure_aggregation"},
               "base.py": {"methods", "config"}, "catalog.py": set(),
               "client_half_check.py": {"methods"}, "flower_args.py": {"methods"},
               "components.py": {"config"},
               "schedules.py": {"methods", "config", "flower_compat"},
               "method_strategy.py": {"methods", "store", "config", "task"},
               "async_loop.py": {"methods", "config", "flower_compat"},
               "engine.py": {"methods"}, "async_state.py": set(),
               "async_robust.py": {"methods"},
               "download_bytes.py": set(), "operator_log.py": set(), "over_select.py": set(),
               "personal_summary.py": {"methods", "config"}, "run_reports.py": {"store"},
               "virtual_clock.py": {"config", "task"}, "sync_schedule.py": {"methods", "config"},
               "device_privacy.py": {"methods", "store", "config"},
               "__init__.py": set()}
    stages = {"methods", "config", "task", "secure_aggregation", "flower_compat"}
    for path in sorted((REPO / "strategies" / "round_stages").glob("*.py")):
        assert project_imports(path) - {"strategies"} <= stages, path.name
    for path in sorted((REPO / "strategies").glob("*.py")):
        assert project_imports(path) - {"strategies"} <= allowed[path.name], path.name


def test_the_projects_fab_carries_the_package() -> None:
    """``flwr run .`` ships what Flower's rules keep (``fedinit/flower_compat/app_source.py``)."""
    files = app_files(REPO)
    assert files is not None
    wanted = {p.relative_to(REPO).as_posix() for p in (REPO / "strategies").rglob("*.py")}
    assert wanted <= set(files)


# ------------------------------------------------------------------ bit for bit
@pytest.mark.parametrize(("cls", "own", "keys"), [
    (FedInit, {"beta": 0.1}, {"method": "fedavg", "beta": 0.1}),
    (Scaffold, {"beta": 0.0}, {"method": "scaffold", "beta": 0.0}),
    (FedDyn, {"alpha": 0.2, "beta": 0.1}, {"method": "feddyn", "feddyn-alpha": 0.2,
                                           "beta": 0.1}),
])
def test_start_trains_what_the_projects_run_of_that_config_trains(
        tmp_path: Path, cls: type, own: dict[str, Any], keys: dict[str, Any]) -> None:
    cfg = RunConfig.parse({**SMALL, **keys, "output-dir": str(tmp_path)})
    run_experiment(InProcessGrid(cfg.num_clients, cfg.to_dict()), cfg, out_dir=tmp_path / "run")
    with np.load(tmp_path / "run" / "final_model.npz") as z:
        want = [z[f"arr_{i}"] for i in range(len(z.files))]

    strategy = cls(**own, fraction_train=0.5, min_train_nodes=2, min_available_nodes=4,
                   fraction_evaluate=0.0, lr=cfg.train.lr, lr_decay=cfg.train.lr_decay,
                   seed=cfg.seed)
    assert isinstance(strategy, Strategy)
    grid = InProcessGrid(cfg.num_clients, cfg.to_dict())  # the project's ClientApp per node
    w0 = initial_weights(cfg)
    result = strategy.start(grid, ArrayRecord(w0), num_rounds=cfg.train.num_server_rounds,
                            train_config=ConfigRecord({rk.EXPERIMENT: "run"}))
    got = unpack(result.arrays)
    assert len(got) == len(want)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(want, got, strict=True))
    assert [m[rk.NUM_REPLIES] for m in result.train_metrics_clientapp.values()] == [2, 2, 2]
    assert strategy.inner is not None and strategy.inner.cfg.method == keys["method"]


# ------------------------------------------------------------------ one-line errors
@pytest.mark.parametrize(("make", "keys", "renames"), [
    (lambda: FedDyn(alpha=0.0), {"method": "feddyn", "feddyn-alpha": 0.0},
     {"feddyn-alpha": "alpha"}),
    (lambda: FedDyn(alpha=50.0, lr=0.05), {"method": "feddyn", "feddyn-alpha": 50.0,
                                           "lr": 0.05}, {"feddyn-alpha": "alpha"}),
    (lambda: FedInit(beta=1.5), {"beta": 1.5}, {}),
    (lambda: Scaffold(fraction_train=0.0), {"fraction-train": 0.0},
     {"fraction-train": "fraction_train"}),
    (lambda: FedInit(weighting="exmaples"), {"weighting": "exmaples"}, {}),
    (lambda: Scaffold(aggregation="krum", byzantine_f=-1),
     {"aggregation": "krum", "byzantine-f": -1}, {"byzantine-f": "byzantine_f"}),
])
def test_bad_arguments_give_the_run_configs_error_named_by_the_argument(
        make: Any, keys: dict[str, Any], renames: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as run_config:
        RunConfig.parse(keys)
    want = str(run_config.value).removeprefix("run config: ")
    for key, arg in renames.items():
        want = want.replace(key, arg)
    with pytest.raises(ConfigError) as strategy:
        make()
    name = str(strategy.value).split(":", 1)[0]
    assert str(strategy.value) == f"{name}: {want}"
    assert "\n" not in str(strategy.value)


def test_a_setting_wrong_for_the_federation_found_fails_at_start() -> None:
    strategy = FedInit(min_replies=3, fraction_train=0.5, min_available_nodes=4, lr=0.05)
    grid = InProcessGrid(4, RunConfig.parse(SMALL).to_dict())
    with pytest.raises(ConfigError, match=r"^FedInit: min_replies=3 is not allowed; allowed: "
                       r"at most the clients per round \(2\)$"):
        strategy.start(grid, ArrayRecord(initial_weights(RunConfig.parse(SMALL))))
    assert grid.sent == []  # before any work
    with pytest.raises(ConfigError, match="lr is not given"):
        FedInit(min_available_nodes=4).start(grid, ArrayRecord([np.zeros(2, np.float32)]))
    with pytest.raises(ConfigError, match="differ"):
        FedInit(min_available_nodes=4, lr=0.1).start(
            grid, ArrayRecord([np.zeros(2, np.float32)]),
            train_config=ConfigRecord({"lr": 0.2}))


# ------------------------------------------------------------------ the client half
D, N = 3, 8


def problem(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = np.random.default_rng(seed)
    x = g.normal(size=(N, D)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5]) + 0.1 * g.normal(size=N)).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(y)


def mse_step(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return ((model(x).squeeze(-1) - y) ** 2).mean()


def grad(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """d/dw of mean((x w - y)^2), in float64: the step's gradient computed by hand."""
    return (2.0 / len(y)) * x.T @ (x @ w - y)


def message(method: str, params: dict[str, Any], w_t: np.ndarray, server_round: int, *,
            beta: float = 0.0, lr: float = 0.1, delta: bool = False, accounted: int = 0,
            extras: dict[str, np.ndarray] | None = None) -> Message:
    """A train message as a strategies server sends it, built from the wire names."""
    spec = METHODS[method]
    conf = {rk.ROUND: server_round, rk.LR: lr, rk.BETA: beta, rk.UPLOAD_DELTA: delta,
            rk.ACCOUNTED_ROUND: accounted, rk.CLIENT_ID: 0,
            **method_config(method, spec.params.from_config(params))}
    content = RecordDict({rk.ARRAYS: ArrayRecord([w_t.reshape(1, D).astype(np.float32)]),
                          rk.CONFIG: ConfigRecord(conf),
                          **{k: pack([v.reshape(1, D).astype(np.float32)])
                             for k, v in (extras or {}).items()}})
    set_task_identity()
    return Message(content=content, message_type=MessageType.TRAIN, dst_node_id=7)


def node() -> Context:
    return Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})


def user_train(msg: Message, ctx: Context, x: torch.Tensor, y: torch.Tensor, epochs: int,
               **kw: Any) -> tuple[Message, list[np.ndarray]]:
    """The user's ClientApp: a bias-free linear model, one full batch per epoch; also
    returns the weights the first step saw (the start point)."""
    model = nn.Linear(D, 1, bias=False)
    seen: list[np.ndarray] = []

    def step(m: nn.Module, batch: Any) -> torch.Tensor:
        if not seen:
            seen.append(m.weight.detach().numpy().reshape(-1).astype(np.float64).copy())
        return mse_step(m, batch)

    reply = method_train(msg, ctx, model, [(x, y)], epochs=epochs, step=step, num_examples=N,
                         **kw)
    return reply, seen


def test_ri_starts_from_w_plus_beta_times_w_minus_the_stored_w_prev() -> None:
    x, y = problem(0)
    ctx, beta = node(), 0.1
    w0 = np.array([0.3, 0.1, -0.2])
    first, seen1 = user_train(message("fedavg", {}, w0, 1, beta=beta), ctx, x, y, 2,
                              initial=lambda: [w0.reshape(1, D).astype(np.float32)])
    assert np.allclose(seen1[0], w0, atol=1e-7)  # round 1: w_prev = w_0 = w_t
    w_prev = unpack(first.content.array_records[rk.ARRAYS])[0].reshape(-1).astype(np.float64)
    assert np.allclose(stored_state(ctx)[W_PREV][0].reshape(-1), w_prev)
    w_t = np.array([0.9, -1.1, 0.4])
    _, seen2 = user_train(message("fedavg", {}, w_t, 4, beta=beta), ctx, x, y, 2)
    assert np.allclose(seen2[0], w_t + beta * (w_t - w_prev), atol=1e-6)
    assert not np.allclose(seen2[0], w_t, atol=1e-3)


def scaffold_by_hand(w: np.ndarray, c: np.ndarray, c_i: np.ndarray, x: np.ndarray,
                     y: np.ndarray, lr: float, k: int) -> tuple[np.ndarray, np.ndarray]:
    """SCAFFOLD option II for one client: K steps of y - lr (g + c - c_i), then
    c_i+ = c_i - c + (s - y_K) / (K lr). Returns (y_K, c_i+)."""
    s = w.copy()
    for _ in range(k):
        w = w - lr * (grad(w, x, y) + c - c_i)
    return w, c_i - c + (s - w) / (k * lr)


def test_scaffold_correction_and_c_i_match_a_computation_by_hand() -> None:
    x, y = problem(1)
    xn, yn = x.numpy().astype(np.float64), y.numpy().astype(np.float64)
    ctx, lr, k = node(), 0.05, 3
    w1, c1 = np.array([0.2, 0.0, -0.1]), np.array([0.3, -0.2, 0.1])
    reply, _ = user_train(message("scaffold", {}, w1, 1, lr=lr, extras={C_GLOBAL: c1}), ctx,
                          x, y, k)
    want_w, want_ci = scaffold_by_hand(w1, c1, np.zeros(D), xn, yn, lr, k)
    got_w = unpack(reply.content.array_records[rk.ARRAYS])[0].reshape(-1)
    got_dc = unpack(reply.content.array_records[DELTA_C])[0].reshape(-1)
    assert np.allclose(got_w, want_w, atol=1e-5)
    assert np.allclose(got_dc, want_ci, atol=1e-4)  # Delta c_i = c_i+ - 0
    assert reply.content.metric_records[rk.METRICS][rk.NUM_STEPS] == k
    # round 3: the server aggregated round 1's reply, so c_i continues from it
    w3, c3 = np.array([0.5, -0.4, 0.2]), np.array([0.1, 0.1, -0.3])
    user_train(message("scaffold", {}, w3, 3, lr=lr, accounted=1, extras={C_GLOBAL: c3}),
               ctx, x, y, k)
    _, want_ci3 = scaffold_by_hand(w3, c3, want_ci, xn, yn, lr, k)
    assert np.allclose(stored_state(ctx)[C_LOCAL][0].reshape(-1), want_ci3, atol=1e-4)
    # round 5: the server names round 1 again (round 3's reply was lost): c_i restarts from
    # round 1's version, not from round 3's
    user_train(message("scaffold", {}, w3, 5, lr=lr, accounted=1, extras={C_GLOBAL: c3}),
               ctx, x, y, k)
    assert np.allclose(stored_state(ctx)[C_LOCAL][0].reshape(-1), want_ci3, atol=1e-4)
    user_train(message("scaffold", {}, w3, 6, lr=lr, accounted=0, extras={C_GLOBAL: c3}),
               ctx, x, y, k)
    _, from_zero = scaffold_by_hand(w3, c3, np.zeros(D), xn, yn, lr, k)
    assert np.allclose(stored_state(ctx)[C_LOCAL][0].reshape(-1), from_zero, atol=1e-4)


def test_feddyn_terms_and_h_i_match_a_computation_by_hand() -> None:
    x, y = problem(2)
    xn, yn = x.numpy().astype(np.float64), y.numpy().astype(np.float64)
    ctx, lr, k, alpha, beta = node(), 0.05, 4, 0.3, 0.1
    params = {"feddyn-alpha": alpha}
    h = np.zeros(D)
    w_prev = np.array([0.1, 0.1, 0.1])  # w_0
    for rnd, (w_t, accounted) in enumerate([(w_prev, 0), (np.array([0.4, -0.6, 0.3]), 1)], 1):
        s = w_t + beta * (w_t - w_prev)
        w = s.copy()
        for _ in range(k):
            w = w - lr * (grad(w, xn, yn) + alpha * (w - s) + alpha * h)
        reply, seen = user_train(
            message("feddyn", params, w_t, rnd, beta=beta, lr=lr, delta=True,
                    accounted=accounted), ctx, x, y, k,
            initial=lambda: [np.full((1, D), 0.1, np.float32)])
        assert np.allclose(seen[0], s, atol=1e-6)
        up = unpack(reply.content.array_records[rk.ARRAYS])[0].reshape(-1)
        assert np.allclose(up, w - s, atol=1e-5)  # update variant: Delta_i
        h, w_prev = h + (w - s), w
        assert np.allclose(stored_state(ctx)[H_LOCAL][0].reshape(-1), h, atol=1e-5)


def test_a_message_from_another_server_is_refused_in_one_line() -> None:
    x, y = problem(0)
    msg = message("fedavg", {}, np.zeros(D), 1)
    del msg.content.config_records[rk.CONFIG]["method"]
    with pytest.raises(ValueError, match="no 'method'.*strategies"):
        user_train(msg, node(), x, y, 1)
    with pytest.raises(ValueError, match="buffers"):
        method_train(message("fedavg", {}, np.zeros(D), 1), node(),
                     nn.Sequential(nn.Linear(D, 1), nn.BatchNorm1d(1)), [(x, y)], num_examples=N)


# ------------------------------------------------------------------ a user's app, in process
class UserGrid(LocalGrid):
    """Nodes with unordered ids and no partition ids, each running ``user_train``."""

    def __init__(self, node_ids: Iterable[int]) -> None:
        set_task_identity()
        super().__init__({n: Context(run_id=1, node_id=n, node_config={}, state=RecordDict(),
                                     run_config={}) for n in node_ids})
        self.data = {n: problem(i) for i, n in enumerate(self.contexts)}
        self.trained: list[tuple[int, int]] = []

    def answer(self, msg: Message, ctx: Context) -> Message | None:
        n = msg.metadata.dst_node_id
        if msg.metadata.message_type == MessageType.TRAIN:
            conf = msg.content.config_records[rk.CONFIG]
            self.trained.append((n, int(conf[rk.CLIENT_ID])))  # type: ignore[arg-type]
            return user_train(msg, ctx, *self.data[n], 2)[0]
        return Message(RecordDict(), reply_to=msg)


def test_a_users_app_numbers_nodes_by_id_and_keeps_its_state_dict_keys() -> None:
    torch.manual_seed(0)  # the model's init: not whatever earlier tests left in torch's RNG
    grid = UserGrid([905, 17, 4242, 311])
    model = nn.Linear(D, 1, bias=False)
    strategy = Scaffold(fraction_train=0.5, min_available_nodes=4, fraction_evaluate=0.0)
    result = strategy.start(grid, ArrayRecord(model.state_dict()), num_rounds=3,
                            train_config=ConfigRecord({"lr": 0.05}))
    assert strategy.client_of == {17: 0, 311: 1, 905: 2, 4242: 3}
    assert all(strategy.client_of[n] == cid for n, cid in grid.trained)
    assert [m[rk.NUM_REPLIES] for m in result.train_metrics_clientapp.values()] == [2, 2, 2]
    assert list(result.arrays.to_torch_state_dict()) == ["weight"]
    for n in {n for n, _ in grid.trained}:  # every trained node kept w_prev and c_i
        assert {W_PREV, C_LOCAL} <= set(stored_state(grid.contexts[n]))


@pytest.mark.parametrize("cls", STRATEGIES, ids=lambda c: c.__name__)
def test_every_class_trains_a_users_app_without_a_rejected_reply(cls: type) -> None:
    """Each method's client rule through ``method_train`` (FedSAM's own batch gradient,
    Ditto's second pass, FedRelax's and clustered FL's own models) gives replies the
    project's checks accept. Seeded: with whatever earlier tests of the same worker left in
    torch's RNG, the init was now and then one whose round-1 moves the norm filter rejects."""
    torch.manual_seed(0)
    grid = UserGrid([40, 10, 30, 20])
    model = nn.Linear(D, 1, bias=False)
    result = cls(fraction_train=0.5, min_available_nodes=4, fraction_evaluate=0.0,
                 lr=0.05).start(grid, ArrayRecord(model.state_dict()), num_rounds=2)
    rounds = list(result.train_metrics_clientapp.values())
    assert [(m[rk.NUM_REPLIES], m[rk.NUM_REJECTED]) for m in rounds] == [(2, 0), (2, 0)]
    assert np.all(np.isfinite(unpack(result.arrays)[0]))


@pytest.mark.parametrize("keys", [{"method": "scaffold", "beta": 0.1},
                                  {"method": "feddyn", "beta": 0.1, "ri-aggregation": "update"},
                                  {"method": "ditto", "beta": 0.0}])
def test_participate_with_the_projects_sgd_pass_replies_what_client_round_does(
        keys: dict[str, Any]) -> None:
    """The project's ClientApp runs this API (``client_round`` is ``participate`` with the
    run's config filled in): ``participate`` with the run's own SGD pass gives
    ``client_round``'s reply and state, bit for bit (compute-seconds aside), so the two
    cannot drift apart again."""

    cfg = RunConfig.parse(keys)
    rule = cfg.spec.client(cfg.params)
    g = np.random.default_rng(3)
    x = torch.from_numpy(g.normal(size=(40, D)).astype(np.float32))
    y = torch.from_numpy(g.integers(0, 2, size=40))
    model = nn.Linear(D, 2)
    w_t = [g.normal(size=p.shape).astype(np.float32) for p in model.parameters()]
    w_0 = [g.normal(size=p.shape).astype(np.float32) for p in model.parameters()]
    conf = ConfigRecord({rk.ROUND: 3, rk.LR: 0.05, rk.BETA: cfg.train.beta,
                         rk.UPLOAD_DELTA: cfg.train.ri_aggregation == "update"})
    down = {k: pack([g.normal(size=a.shape).astype(np.float32) for a in w_t])
            for k in rule.down_keys}
    received = RecordDict({rk.ARRAYS: pack(w_t), rk.CONFIG: conf, **down})
    stored = {k: [g.normal(size=a.shape).astype(np.float32) for a in w_t]
              for k in (W_PREV, *rule.state_keys)}
    stores = [ClientStore(memory=RecordDict()) for _ in range(2)]
    for store in stores:
        for k, v in stored.items():
            store.put(k, v)

    want = client_round(cfg, rule, received, stores[0], model, x, y, initial=lambda: w_0,
                        partition_id=1)

    def make_sgd(server_round: int, lr: float) -> Any:
        return sgd_pass(model, x, y, SgdSettings(
            epochs=cfg.train.local_epochs, batch_size=cfg.train.batch_size, lr=lr,
            weight_decay=cfg.train.weight_decay, clip_norm=cfg.train.clip_norm, seed=cfg.seed,
            server_round=server_round, partition_id=1))

    got = participate(rule, received, stores[1], make_sgd, torch.device("cpu"),
                      initial=lambda: w_0, release=Mechanism.from_config(cfg).release)
    assert set(got.array_records) == set(want.array_records)
    for k in want.array_records:
        assert all(a.tobytes() == b.tobytes() for a, b in zip(
            unpack(want.array_records[k]), unpack(got.array_records[k]), strict=True)), k
    w_metrics, g_metrics = (dict(r.metric_records[rk.METRICS]) for r in (want, got))
    assert w_metrics.pop(rk.COMPUTE_SECONDS) > 0.0 and g_metrics.pop(rk.COMPUTE_SECONDS) > 0.0
    assert g_metrics == w_metrics
    assert dict(got.config_records[rk.CONFIG]) == dict(want.config_records[rk.CONFIG])
    a, b = stores[0].entries(), stores[1].entries()
    assert set(a) == set(b) and all(
        x.tobytes() == z.tobytes() for k in a for x, z in zip(a[k], b[k], strict=True))
