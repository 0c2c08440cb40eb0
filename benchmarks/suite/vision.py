"""The suite's torchvision and timm models: the architectures PyTorch's TorchBench and TIMM
dashboards measure, built without weights (nothing is downloaded), in eval mode.

`full` is the dashboard's ImageNet shape scaled to one GPU (32 x 3 x 224 x 224); `small` a CPU
shape (2 images, 64 pixels where the architecture takes any size; models whose positional
tables or windows fix the size keep 224). Both libraries are optional: where one does not import
(torchvision's PyPI wheel needs a matching torch; timm is an extra), its models are reported as
not built, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from benchmarks.models import MissingDependency, torchvision_available

SHAPES = {"small": (2, 64), "full": (32, 224)}


@dataclass(frozen=True)
class VisionModel:
    """A constructor of `library` by name; `fixed_side`: the image side the architecture needs
    (None: any); `kwargs`: constructor arguments beyond num_classes (e.g. a ViT's image size)."""

    name: str
    library: str  # torchvision | timm
    fixed_side: int | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    sized: bool = False  # the constructor takes the image side (ViT-style positional tables)
    note: str = ""


TORCHVISION: tuple[VisionModel, ...] = (
    VisionModel("resnet18", "torchvision"),
    VisionModel("resnet50", "torchvision"),
    VisionModel("resnext50_32x4d", "torchvision", note="grouped convolutions"),
    VisionModel("wide_resnet50_2", "torchvision"),
    VisionModel("densenet121", "torchvision", note="concatenated features"),
    VisionModel("mobilenet_v2", "torchvision", note="depthwise convolutions"),
    VisionModel("mobilenet_v3_large", "torchvision", note="hard-swish, squeeze-excitation"),
    VisionModel("efficientnet_b0", "torchvision", note="SiLU, squeeze-excitation"),
    VisionModel("regnet_y_400mf", "torchvision"),
    VisionModel("shufflenet_v2_x1_0", "torchvision", note="channel shuffle"),
    VisionModel("mnasnet1_0", "torchvision"),
    VisionModel("squeezenet1_1", "torchvision"),
    VisionModel("convnext_tiny", "torchvision", note="layer norm over channels"),
    VisionModel("swin_t", "torchvision", fixed_side=224, note="shifted windows"),
    VisionModel("vit_b_16", "torchvision", sized=True, note="image size fixes its positional table"),
)

TIMM: tuple[VisionModel, ...] = (
    VisionModel("resnet50", "timm"),
    VisionModel("resnext50_32x4d", "timm"),
    VisionModel("res2net50_14w_8s", "timm", note="multi-scale residual"),
    VisionModel("densenet121", "timm"),
    VisionModel("dla34", "timm"),
    VisionModel("cspdarknet53", "timm"),
    VisionModel("repvgg_a2", "timm"),
    VisionModel("regnety_016", "timm"),
    VisionModel("mobilenetv2_100", "timm"),
    VisionModel("mobilenetv3_large_100", "timm"),
    VisionModel("efficientnet_b0", "timm"),
    VisionModel("ghostnet_100", "timm"),
    VisionModel("rexnet_100", "timm"),
    VisionModel("convnext_tiny", "timm"),
    VisionModel("poolformer_s12", "timm"),
    VisionModel("mixer_b16_224", "timm", fixed_side=224, note="MLP-Mixer"),
    VisionModel("vit_small_patch16_224", "timm", sized=True),
    VisionModel("deit_small_patch16_224", "timm", sized=True),
    VisionModel("swin_tiny_patch4_window7_224", "timm", fixed_side=224, note="shifted windows"),
    VisionModel("coat_lite_mini", "timm", fixed_side=224),
    VisionModel("convit_tiny", "timm", sized=True),
)


def available(library: str) -> str | None:
    """None when `library` imports and builds models here, else why not."""
    if library == "torchvision":
        return None if torchvision_available() else "torchvision does not import here (missing, or built for another torch)"
    try:
        import timm  # noqa: F401
    except Exception as error:  # ImportError, or torchvision's failure inside timm's import
        return f"timm does not import here ({type(error).__name__}: {error})"
    return None


def build(entry: VisionModel, device: torch.device, dtype: torch.dtype, size: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model (eval mode, `dtype`, on `device`) and a batch of images at `size`."""
    problem = available(entry.library)
    if problem is not None:
        raise MissingDependency(problem)
    batch, side = SHAPES[size]
    side = entry.fixed_side or side
    kwargs = dict(entry.kwargs)
    if entry.sized:
        kwargs["image_size" if entry.library == "torchvision" else "img_size"] = side
    if entry.library == "torchvision":
        import torchvision.models

        model = torchvision.models.get_model(entry.name, weights=None, num_classes=1000, **kwargs)
    else:
        import timm

        model = timm.create_model(entry.name, pretrained=False, num_classes=1000, **kwargs)
    images = torch.randn(batch, 3, side, side, device=device, dtype=dtype)
    return model.to(device=device, dtype=dtype).eval(), (images,)
