"""Models for the FedInit experiments, built deterministically and without buffers.

No model here keeps running statistics (no BatchNorm), so a model's full state is its
parameter list: every per-client state vector (c_i, h_i, w_prev_i) then has the same layout as
`get_weights(model)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fedinit.config.choices import MODEL_NAMES, check_model_input

if TYPE_CHECKING:
    from fedinit.config import RunConfig
    from fedinit.data_sets import DataSplits, Schema

# Small CNN widths, kept in one place so CPU cost can be tuned (about 54k parameters with these).
CNN_CONV1_CHANNELS = 8
CNN_CONV2_CHANNELS = 16
CNN_HIDDEN = 64
CNN_KERNEL = 5
CNN_INPUT_SIZE = 28  # default side; two 2x2 max-pools: 28 -> 14 -> 7 (32 -> 8 for CIFAR)

# GroupNorm groups replacing BatchNorm in ResNet-18 (the paper's ResNet-18-GN).
RESNET_GN_GROUPS = 2

# VGG-11 convolution plan ("M" = 2x2 max-pool); five pools take 32x32 down to 1x1x512.
VGG11_CONFIG: tuple[int | str, ...] = (
    64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M",
)  # fmt: skip


class SmallCNN(nn.Module):
    """Two conv layers and two linear layers: a CPU-sized model for small square images."""

    def __init__(self, num_classes: int, in_channels: int,
                 image_size: int = CNN_INPUT_SIZE) -> None:
        super().__init__()
        pad = CNN_KERNEL // 2
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, CNN_CONV1_CHANNELS, CNN_KERNEL, padding=pad),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(CNN_CONV1_CHANNELS, CNN_CONV2_CHANNELS, CNN_KERNEL, padding=pad),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        side = image_size // 4
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(CNN_CONV2_CHANNELS * side * side, CNN_HIDDEN),
            nn.ReLU(inplace=True),
            nn.Linear(CNN_HIDDEN, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (N, C, S, S) images (S = image_size) to (N, num_classes) logits."""
        return self.classifier(self.features(x))


class VGG11(nn.Module):
    """VGG-11 without batch norm for 32x32 inputs.

    The classifier is a single Linear(512, num_classes): after five pools a 32x32 image is a
    512-vector, and the usual CIFAR VGG variants use one linear head (the 4096-wide ImageNet
    head would add ~100M parameters for nothing on 1x1 features).
    """

    def __init__(self, num_classes: int, in_channels: int, image_size: int = 32) -> None:
        super().__init__()
        del image_size  # checked by check_model_input: five pools need exactly 32
        layers: list[nn.Module] = []
        channels = in_channels
        for item in VGG11_CONFIG:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                assert isinstance(item, int)
                layers.append(nn.Conv2d(channels, item, kernel_size=3, padding=1))
                layers.append(nn.ReLU(inplace=True))
                channels = item
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        """He init for convs and small linear init: without BN, default init trains slowly."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, 0.01)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (N, C, 32, 32) images to (N, num_classes) logits."""
        return self.classifier(torch.flatten(self.features(x), 1))


def _group_norm(channels: int) -> nn.GroupNorm:
    """The ResNet norm: GroupNorm keeps no running buffers (unlike BatchNorm)."""
    return nn.GroupNorm(RESNET_GN_GROUPS, channels)


def _conv(in_channels: int, out_channels: int, kernel: int, stride: int = 1) -> nn.Conv2d:
    """A bias-free square conv padded to keep the side at stride 1 (3x3: 1, 1x1: 0, 7x7: 3)."""
    return nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=kernel // 2,
                     bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual; `downsample` (1x1 conv + norm) maps the input to the
    output's shape when the stride or the width changes.

    The attribute names and their registration order are torchvision's (conv1, bn1, conv2, bn2,
    downsample.0/.1): they fix the state-dict and parameter order and the order in which
    ResNet18GN He-initialises the convs, so seeded weights match torchvision's.
    """

    def __init__(self, in_channels: int, channels: int, stride: int = 1,
                 downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv(in_channels, channels, 3, stride)
        self.bn1 = _group_norm(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv(channels, channels, 3)
        self.bn2 = _group_norm(channels)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """conv-norm-relu-conv-norm, plus the (downsampled) input, then relu."""
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet18GN(nn.Module):
    """ResNet-18 with GroupNorm(2, C) and the ImageNet 7x7 stem, as the paper's authors used.

    Plain torch, so every image (CPU ones without torchvision included) can build it. Module
    names, parameter order and, for a given seed, the initial weights are those of
    ``torchvision.models.resnet18(num_classes, norm_layer=GroupNorm(2, C))`` whose ``conv1`` is
    replaced (and He-initialised) for in_channels != 3, which this project built before;
    tests/test_task_models.py checks this bit for bit against torchvision.
    """

    STAGES: tuple[tuple[int, int], ...] = ((64, 1), (128, 2), (256, 2), (512, 2))
    BLOCKS_PER_STAGE = 2

    def __init__(self, num_classes: int, in_channels: int, image_size: int = 32) -> None:
        super().__init__()
        del image_size  # any side >= 28 after the adaptive pool; checked by check_model_input
        width = self.STAGES[0][0]
        # The stem is built for 3 channels first whatever in_channels is: its default init
        # draws from the RNG like torchvision's, so every later layer gets the same weights.
        self.conv1 = _conv(3, width, 7, stride=2)
        self.bn1 = _group_norm(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        for index, (channels, stride) in enumerate(self.STAGES, start=1):
            self.add_module(f"layer{index}", self._stage(width, channels, stride))
            width = channels
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width, num_classes)  # keeps nn.Linear's default init
        for module in self.modules():  # registration order, as torchvision
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.GroupNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        if in_channels != 3:
            self.conv1 = _conv(in_channels, self.STAGES[0][0], 7, stride=2)
            nn.init.kaiming_normal_(self.conv1.weight, mode="fan_out", nonlinearity="relu")

    def _stage(self, in_channels: int, channels: int, stride: int) -> nn.Sequential:
        """BLOCKS_PER_STAGE blocks; the first one strides and, if needed, downsamples."""
        downsample = None
        if stride != 1 or in_channels != channels:
            downsample = nn.Sequential(_conv(in_channels, channels, 1, stride),
                                       _group_norm(channels))
        blocks = [BasicBlock(in_channels, channels, stride, downsample)]
        blocks += [BasicBlock(channels, channels) for _ in range(1, self.BLOCKS_PER_STAGE)]
        return nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map (N, C, S, S) images to (N, num_classes) logits."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


_BUILDERS: dict[str, Callable[[int, int, int], nn.Module]] = {
    "cnn": SmallCNN,
    "resnet18-gn": ResNet18GN,
    "vgg11": VGG11,
}


NATIVE_IMAGE_SIZES: dict[str, int] = {"cnn": CNN_INPUT_SIZE, "resnet18-gn": 32, "vgg11": 32}
"""The image side each model is built for when the caller does not say."""


def build_model(
    name: str, num_classes: int, in_channels: int, seed: int, image_size: int | None = None,
) -> nn.Module:
    """Build a model for square images of side ``image_size`` (default: the model's native
    size) whose initial weights depend only on `seed`.

    The CPU RNG is forked and seeded (`torch.manual_seed` restricted to the CPU generator, which
    is the one initialisation uses), so building a model neither shifts the random stream other
    code relies on nor initialises or reseeds CUDA.
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown model name {name!r}; allowed: {', '.join(MODEL_NAMES)}")
    if num_classes < 1 or in_channels < 1:
        raise ValueError(
            f"num_classes and in_channels must be >= 1, got {num_classes} and {in_channels}"
        )
    if image_size is None:
        image_size = NATIVE_IMAGE_SIZES[name]
    check_model_input(name, image_size)
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        model = _BUILDERS[name](num_classes, in_channels, image_size)
    return model


def initial_model(cfg: RunConfig, data: DataSplits | Schema | None = None) -> nn.Module:
    """The run's model at w_0: the one seeded build that server, clients and checks share.

    Built from the run's schema (``fedinit.config.data.schema_of``: the data set's own, or the
    one the run config declares for device data), so the server needs no data to build it;
    ``data`` (loaded splits or a schema) overrides it."""
    if data is None:
        from fedinit.config.data import schema_of

        data = schema_of(cfg)
    return build_model(cfg.train.model, data.num_classes, data.in_channels, cfg.seed,
                       data.image_size)


def initial_weights(cfg: RunConfig,
                    data: DataSplits | Schema | None = None) -> list[np.ndarray]:
    """w_0 as arrays in wire order (the server's first global model, the clients' fallback)."""
    return get_weights(initial_model(cfg, data))


def get_weights(model: nn.Module) -> list[np.ndarray]:
    """Return float32 copies of the parameters, in `model.parameters()` order (the wire order)."""
    return [p.detach().cpu().numpy().astype(np.float32, copy=True) for p in model.parameters()]


def set_weights(model: nn.Module, weights: list[np.ndarray]) -> None:
    """Copy `weights` into the model's parameters in place, checking count and shapes first.

    Checking everything before copying leaves the model untouched when the input is wrong.
    """
    params = list(model.parameters())
    if len(weights) != len(params):
        raise ValueError(f"expected {len(params)} weight arrays, got {len(weights)}")
    for index, (param, value) in enumerate(zip(params, weights, strict=True)):
        shape = tuple(np.shape(value))
        if shape != tuple(param.shape):
            raise ValueError(
                f"weight {index}: shape {shape} does not match parameter shape {tuple(param.shape)}"
            )
    with torch.no_grad():
        for param, value in zip(params, weights, strict=True):
            source = torch.from_numpy(np.array(value, dtype=np.float32, copy=True))
            param.copy_(source.to(device=param.device, dtype=param.dtype))
