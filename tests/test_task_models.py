"""Model tests: shapes, no buffers, seed determinism, weight round trips."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedinit.task.models import MODEL_NAMES, RESNET_GN_GROUPS, build_model, get_weights, set_weights

REPO = Path(__file__).resolve().parents[1]

# (name, in_channels, image side, num_classes)
CASES = [
    ("cnn", 1, 28, 10),
    ("cnn", 3, 28, 7),
    ("cnn", 3, 32, 10),
    ("resnet18-gn", 3, 32, 10),
    ("resnet18-gn", 1, 28, 10),
    ("vgg11", 3, 32, 100),
]


@pytest.mark.parametrize(("name", "channels", "side", "classes"), CASES)
def test_forward_shape_and_no_buffers(name: str, channels: int, side: int, classes: int) -> None:
    model = build_model(name, classes, channels, seed=0, image_size=side)
    with torch.no_grad():
        out = model(torch.zeros(2, channels, side, side))
    assert out.shape == (2, classes)
    assert list(model.buffers()) == []


@pytest.mark.parametrize(("name", "side", "allowed"), [
    ("vgg11", 28, "32x32"), ("cnn", 30, "multiple of 4"), ("resnet18-gn", 16, ">= 28"),
])
def test_a_model_rejects_an_image_size_it_cannot_take(name: str, side: int, allowed: str) -> None:
    with pytest.raises(ValueError, match=allowed):
        build_model(name, 10, 3, seed=0, image_size=side)


def test_every_name_builds() -> None:
    assert set(MODEL_NAMES) == {"cnn", "resnet18-gn", "vgg11"}
    for name in MODEL_NAMES:
        assert sum(p.numel() for p in build_model(name, 10, 3, seed=0).parameters()) > 0


def test_parameter_counts() -> None:
    counts = {n: sum(p.numel() for p in build_model(n, 10, 3, 0).parameters()) for n in MODEL_NAMES}
    print("parameter counts (3 channels, 10 classes):", counts)
    cnn = sum(p.numel() for p in build_model("cnn", 10, 1, 0).parameters())
    assert 50_000 < cnn < 60_000
    assert 11_000_000 < counts["resnet18-gn"] < 11_300_000
    assert not any(
        isinstance(m, torch.nn.BatchNorm2d) for m in build_model("resnet18-gn", 10, 3, 0).modules()
    )


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_seed_determinism(name: str) -> None:
    first = get_weights(build_model(name, 10, 3, seed=3))
    again = get_weights(build_model(name, 10, 3, seed=3))
    other = get_weights(build_model(name, 10, 3, seed=4))
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert any(not np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_global_rng_untouched() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_model("cnn", 10, 1, seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_unknown_name() -> None:
    with pytest.raises(ValueError, match=r"'lenet'.*cnn, resnet18-gn, vgg11"):
        build_model("lenet", 10, 1, seed=0)


def test_weights_round_trip() -> None:
    source = build_model("cnn", 10, 1, seed=1)
    target = build_model("cnn", 10, 1, seed=2)
    weights = get_weights(source)
    assert all(w.dtype == np.float32 for w in weights)
    assert [w.shape for w in weights] == [tuple(p.shape) for p in source.parameters()]
    set_weights(target, weights)
    assert all(np.array_equal(a, b) for a, b in zip(get_weights(target), weights, strict=True))
    weights[0][...] = 0.0  # get_weights returns copies, not views
    assert not np.array_equal(get_weights(source)[0], weights[0])
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(source(x), target(x))


def test_set_weights_errors() -> None:
    model = build_model("cnn", 10, 1, seed=0)
    weights = get_weights(model)
    bad = list(weights)
    bad[2] = np.zeros((3, 3), dtype=np.float32)
    with pytest.raises(ValueError, match=r"weight 2: shape \(3, 3\).*\(16, 8, 5, 5\)"):
        set_weights(model, bad)
    with pytest.raises(ValueError, match=f"expected {len(weights)} weight arrays, got 1"):
        set_weights(model, weights[:1])


# resnet18-gn is plain torch, built to match torchvision's resnet18 with GroupNorm(2, C) and this
# project's former conv1 replacement: names, shapes, seeded initial weights and outputs.
TV_CASES = [(3, 32, 10), (3, 28, 100), (1, 32, 100), (1, 28, 10)]
"""Both stems (3 channels: torchvision's; 1: the replaced conv1), both sides (the adaptive pool)
and both heads, every pair of them once: a pairwise cover of the full 2 x 2 x 2 grid."""


def _torchvision_resnet18_gn(num_classes: int, in_channels: int, seed: int) -> torch.nn.Module:
    """The model fedinit.task.models built before it stopped using torchvision, on the same
    RNG fork."""
    resnet18 = pytest.importorskip(
        "torchvision.models", reason="torchvision is needed only as the reference").resnet18
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        model = resnet18(num_classes=num_classes,
                         norm_layer=lambda c: torch.nn.GroupNorm(RESNET_GN_GROUPS, c))
        if in_channels != 3:
            model.conv1 = torch.nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3,
                                          bias=False)
            torch.nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out",
                                          nonlinearity="relu")
    return model


@pytest.mark.parametrize(("channels", "side", "classes"), TV_CASES)
def test_resnet18_gn_matches_torchvision(channels: int, side: int, classes: int) -> None:
    reference = _torchvision_resnet18_gn(classes, channels, seed=5)
    model = build_model("resnet18-gn", classes, channels, seed=5, image_size=side)
    ours, theirs = model.state_dict(), reference.state_dict()
    # Same keys in the same order (the wire order is parameters() order) and the same shapes.
    assert list(ours) == list(theirs)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in reference.named_parameters()]
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}
    # Bit-identical initial weights for the same seed.
    for key, value in ours.items():
        assert value.dtype == theirs[key].dtype and torch.equal(value, theirs[key]), key
    # The same function: perturb the weights (so the norms' affine parts are not just 1/0),
    # load them into both and compare outputs in eval mode.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        perturbed = {k: v + 0.05 * torch.randn_like(v) for k, v in theirs.items()}
        x = torch.randn(3, channels, side, side)
    model.load_state_dict(perturbed)
    reference.load_state_dict(perturbed)
    model.eval()
    reference.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=1e-6, atol=1e-6)


@pytest.mark.slow  # a fresh interpreter importing torch and the apps: 11-23 s
def test_models_build_and_run_without_torchvision() -> None:
    """The CPU images carry no torchvision: every model and app module must do without it."""
    code = (
        "import sys; sys.modules['torchvision'] = None\n"
        "import torch; torch.set_num_threads(1)\n"
        "from fedinit.task.models import MODEL_NAMES, NATIVE_IMAGE_SIZES, build_model\n"
        "for name in MODEL_NAMES:\n"
        "    for channels in (1, 3):\n"
        "        side = NATIVE_IMAGE_SIZES[name]\n"
        "        model = build_model(name, 10, channels, seed=0)\n"
        "        with torch.no_grad():\n"
        "            out = model(torch.zeros(2, channels, side, side))\n"
        "        assert out.shape == (2, 10), (name, out.shape)\n"
        "import importlib, pkgutil\n"  # and every module of the apps imports without it
        "for pkg in ('fedinit.task', 'client_app', 'server_app', 'fedinit.methods'):\n"
        "    for info in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "assert 'torchvision' not in sys.modules or sys.modules['torchvision'] is None\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


def test_w0_is_one_build_shared_by_server_clients_and_cache() -> None:
    """The server's w_0, the clients' cached fallback and the seeded build are the same arrays,
    and the client cache builds it once per config."""
    from client_app import model_cache
    from fedinit.config import RunConfig
    from fedinit.task.federated_data import dataset_of
    from fedinit.task.models import initial_model, initial_weights
    from server_app.central_eval import CentralEvaluator

    cfg = RunConfig.parse({"train-limit": 1000, "seed": 3})
    data = dataset_of(cfg)
    built = get_weights(build_model("cnn", data.num_classes, data.in_channels, 3,
                                    data.image_size))
    cached = model_cache.initial_weights(cfg)
    assert model_cache.initial_weights(cfg) is cached
    for got in (initial_weights(cfg, data), cached, get_weights(initial_model(cfg, data)),
                get_weights(model_cache.cached_model(cfg))):
        assert len(got) == len(built)
        assert all(np.array_equal(a, b) for a, b in zip(got, built, strict=True))
    other = initial_weights(RunConfig.parse({"train-limit": 1000, "seed": 4}), data)
    assert not np.array_equal(other[0], built[0])
    evaluator = CentralEvaluator(cfg)  # its model has the run's shapes
    assert [p.shape for p in evaluator.model.parameters()] == [a.shape for a in built]
