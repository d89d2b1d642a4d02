"""Models for the FedInit experiments, built deterministically and without buffers.

No model here keeps running statistics (no BatchNorm), so a model's full state is its
parameter list: every per-client state vector (c_i, h_i, w_prev_i) then has the same layout as
`get_weights(model)`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from task.choices import MODEL_NAMES, check_model_input

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


def _group_norm(channels: int) -> nn.Module:
    """Norm layer factory for torchvision's ResNet: GroupNorm keeps no running buffers."""
    return nn.GroupNorm(RESNET_GN_GROUPS, channels)


def _resnet18_gn(num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """torchvision ResNet-18 with GroupNorm(2, C) and the 7x7 stem, as the authors used."""
    # Imported here: the slim CPU client images carry no torchvision (no CPU build of it
    # exists offline for their torch), and only this model needs it.
    from torchvision.models import resnet18

    del image_size  # any size >= 32 after its adaptive pool; checked by check_model_input
    model = resnet18(num_classes=num_classes, norm_layer=_group_norm)
    if in_channels != model.conv1.in_channels:
        old = model.conv1
        model.conv1 = nn.Conv2d(
            in_channels,
            old.out_channels,
            kernel_size=old.kernel_size,  # type: ignore[arg-type]
            stride=old.stride,  # type: ignore[arg-type]
            padding=old.padding,  # type: ignore[arg-type]
            bias=False,
        )
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    return model


_BUILDERS: dict[str, Callable[[int, int, int], nn.Module]] = {
    "cnn": SmallCNN,
    "resnet18-gn": _resnet18_gn,
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
