"""Device data: each format loads, each schema mismatch fails with one line naming the file,
the local test split applies, the model comes from the schema, and the config refuses what
a device-data run cannot do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedinit.config import ConfigError, RunConfig
from fedinit.config.data import device_schema, schema_of
from fedinit.data_sets import Schema
from fedinit.data_sets.device import DeviceDataError, load_device_data
from fedinit.task.federated_data import NO_DATA_DIR, client_examples, client_test_examples
from fedinit.task.local_split import local_test_count
from fedinit.task.models import get_weights, initial_model
from tests.device_data import write_image_folder

GRAY = Schema(num_classes=3, in_channels=1, image_size=8, mean=(0.5,), std=(0.5,),
              class_names=("cat", "dog", "emu"))
RGB = Schema(num_classes=2, in_channels=3, image_size=8, mean=(0.5,) * 3, std=(0.5,) * 3,
             class_names=("a", "b"))
DEVICE = {"dataset": "device", "device-classes": "cat,dog,emu", "device-image-size": 8,
          "max-examples-per-client": 1000, "num-clients": 3}


def images(n: int, channels: int, side: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, side, side, channels),
                                                dtype=np.uint8)


def load_error(path: Path, schema: Schema = GRAY) -> str:
    with pytest.raises(DeviceDataError) as info:
        load_device_data(path, schema)
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, ValueError)
    return message


# ---------------------------------------------------------------- formats


def test_png_folder_loads_losslessly_with_labels_from_the_schema(tmp_path: Path) -> None:
    x, y = images(9, 1), np.array([2, 0, 1, 2, 2, 0, 1, 1, 0])
    write_image_folder(tmp_path / "d", x, y, GRAY.class_names)
    got_x, got_y = load_device_data(tmp_path / "d", GRAY)
    # folders sort as cat, dog, emu = labels 0, 1, 2; files by name = original order
    order = np.argsort(y, kind="stable")
    assert got_x.shape == (9, 8, 8, 1) and got_x.dtype == np.uint8
    np.testing.assert_array_equal(got_y, y[order])
    np.testing.assert_array_equal(got_x, x[order])


def test_labels_follow_device_classes_not_folder_order(tmp_path: Path) -> None:
    schema = Schema(2, 1, 8, (0.5,), (0.5,), class_names=("zebra", "ant"))
    write_image_folder(tmp_path / "d", images(2, 1), np.array([0, 1]), schema.class_names)
    _, y = load_device_data(tmp_path / "d", schema)
    assert list(y) == [1, 0]  # the 'ant' folder sorts first and is label 1


def test_jpeg_rgb_folder_loads(tmp_path: Path) -> None:
    x = np.zeros((4, 8, 8, 3), dtype=np.uint8)
    x[:, :, :, 0] = 200  # flat colours survive JPEG closely
    write_image_folder(tmp_path / "d", x, np.array([0, 1, 1, 0]), RGB.class_names, ".jpg")
    got_x, got_y = load_device_data(tmp_path / "d", RGB)
    assert got_x.shape == (4, 8, 8, 3) and list(got_y) == [0, 0, 1, 1]
    assert abs(float(got_x[..., 0].mean()) - 200) < 3 and float(got_x[..., 1].mean()) < 3


@pytest.mark.parametrize("layout", ["NHW", "NHWC"])
def test_npz_loads(tmp_path: Path, layout: str) -> None:
    x, y = images(5, 1), np.array([0, 1, 2, 1, 0], dtype=np.int32)
    np.savez(tmp_path / "d.npz", x=x[..., 0] if layout == "NHW" else x, y=y)
    got_x, got_y = load_device_data(tmp_path / "d.npz", GRAY)
    np.testing.assert_array_equal(got_x, x)
    assert got_y.dtype == np.int64 and list(got_y) == list(y)


# ---------------------------------------------------------------- mismatches


def test_unknown_class_folder(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "d", images(2, 1), np.array([0, 1]), ("cat", "yak"))
    msg = load_error(tmp_path / "d")
    assert str(tmp_path / "d" / "yak") in msg and "not among device-classes" in msg


def test_wrong_size_is_a_mismatch_not_a_resize(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "d", images(1, 1, side=10), np.array([0]), GRAY.class_names)
    msg = load_error(tmp_path / "d")
    assert str(tmp_path / "d" / "cat" / "00000.png") in msg
    assert "10x10" in msg and "8x8" in msg and "not resized" in msg


def test_wrong_channels(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "d", images(1, 3), np.array([1]), GRAY.class_names)
    msg = load_error(tmp_path / "d")
    assert "dog/00000.png" in msg and "'RGB'" in msg and "device-channels" in msg


def test_unreadable_image(tmp_path: Path) -> None:
    (tmp_path / "d" / "emu").mkdir(parents=True)
    (tmp_path / "d" / "emu" / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    msg = load_error(tmp_path / "d")
    assert "emu/broken.jpg" in msg and "cannot decode" in msg


def test_file_that_is_not_an_image(tmp_path: Path) -> None:
    (tmp_path / "d" / "cat").mkdir(parents=True)
    (tmp_path / "d" / "cat" / "notes.txt").write_text("hi")
    assert "cat/notes.txt: not a PNG or JPEG" in load_error(tmp_path / "d")


def test_empty_folder_and_top_level_file(tmp_path: Path) -> None:
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    assert "no images" in load_error(tmp_path / "empty")
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "x.png").write_bytes(b"")
    assert "flat/x.png: a file at the top" in load_error(tmp_path / "flat")


def test_missing_path_and_missing_data_dir(tmp_path: Path) -> None:
    assert "no such file or folder" in load_error(tmp_path / "gone")
    cfg = RunConfig.parse(DEVICE)
    with pytest.raises(ValueError, match="node config has no 'data-dir'") as info:
        client_examples(cfg, 0, "")
    assert str(info.value) == NO_DATA_DIR


@pytest.mark.parametrize(("arrays", "expect"), [
    ({"x": images(2, 1)}, "needs arrays 'x' and 'y'"),
    ({"x": images(2, 1), "y": np.array([0, 3])}, "labels span 0..3"),
    ({"x": images(2, 1, side=9), "y": np.array([0, 1])}, "x has shape (2, 9, 9, 1)"),
    ({"x": images(2, 3), "y": np.array([0, 1])}, "x has shape (2, 8, 8, 3)"),
    ({"x": images(2, 1).astype(np.float32), "y": np.array([0, 1])}, "dtype float32"),
    ({"x": images(2, 1), "y": np.array([0.0, 1.0])}, "integer labels"),
    ({"x": images(0, 1), "y": np.array([], dtype=np.int64)}, "no examples"),
])
def test_npz_mismatches(tmp_path: Path, arrays: dict[str, np.ndarray], expect: str) -> None:
    np.savez(tmp_path / "d.npz", **arrays)
    msg = load_error(tmp_path / "d.npz")
    assert msg.startswith(str(tmp_path / "d.npz")) and expect in msg


def test_unreadable_npz(tmp_path: Path) -> None:
    (tmp_path / "d.npz").write_bytes(b"PK\x03\x04 truncated")
    assert "cannot read .npz" in load_error(tmp_path / "d.npz")


# ---------------------------------------------------------------- split, model, config


def test_local_test_split_applies_to_device_data(tmp_path: Path) -> None:
    x, y = images(40, 1), np.arange(40) % 3
    np.savez(tmp_path / "d.npz", x=x, y=y)
    cfg = RunConfig.parse({**DEVICE, "local-test-fraction": 0.25})
    train_x, train_y = client_examples(cfg, 1, str(tmp_path / "d.npz"))
    test_x, test_y = client_test_examples(cfg, 1, str(tmp_path / "d.npz"))
    assert len(test_y) == local_test_count(40, 0.25) == 10 and len(train_y) == 30
    together = np.concatenate([train_x, test_x]).reshape(40, -1)
    assert len({row.tobytes() for row in together}) == 40  # disjoint, all used
    other = client_test_examples(cfg, 2, str(tmp_path / "d.npz"))[1]
    assert len(other) == 10  # the split is seeded by the client id too


def test_model_is_built_from_the_schema_without_data() -> None:
    cfg = RunConfig.parse({**DEVICE, "device-classes": "a,b,c,d", "device-channels": 3,
                           "device-image-size": 32, "device-mean": "0.1,0.2,0.3",
                           "device-std": "1,1,1"})
    assert device_schema(cfg) == Schema(4, 3, 32, (0.1, 0.2, 0.3), (1.0, 1.0, 1.0),
                                        ("a", "b", "c", "d"))
    shapes = [w.shape for w in get_weights(initial_model(cfg))]
    assert shapes[0] == (8, 3, 5, 5) and shapes[-1] == (4,)


def test_benchmark_schema_builds_the_model_the_data_does() -> None:
    from fedinit.task.federated_data import dataset_of

    cfg = RunConfig.parse({"train-limit": 1000})
    data = dataset_of(cfg)
    s = schema_of(cfg)
    assert (s.num_classes, s.in_channels, s.image_size, s.mean, s.std) == (
        data.num_classes, data.in_channels, data.image_size, data.mean, data.std)
    for a, b in zip(get_weights(initial_model(cfg)), get_weights(initial_model(cfg, data)),
                    strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("over", "key"), [
    ({"device-classes": ""}, "device-classes"),
    ({"device-classes": "cat"}, "device-classes"),
    ({"device-classes": "cat,cat"}, "device-classes"),
    ({"device-classes": "cat,a/b"}, "device-classes"),
    ({"device-channels": 2}, "device-channels"),
    ({"device-channels": 3}, "device-mean"),
    ({"device-std": "0"}, "device-std"),
    ({"device-mean": "x"}, "device-mean"),
    ({"device-image-size": 30}, "does not fit dataset='device'"),
    ({"max-examples-per-client": 0}, "max-examples-per-client=0"),
    ({"evaluation": "central"}, "evaluation='central'"),
    ({"local-test-fraction": 0.0, "personal-eval-every": 0}, "local-test-fraction=0.0"),
    ({"federated-eval-clients": -1}, "federated-eval-clients"),
])
def test_device_config_is_checked_in_one_line(over: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match="run config: ") as info:
        RunConfig.parse({**DEVICE, **over})
    assert key in str(info.value) and "\n" not in str(info.value)


def test_evaluation_resolves() -> None:
    assert RunConfig.parse({}).eval_source == "central"
    assert RunConfig.parse(DEVICE).eval_source == "federated"
    assert RunConfig.parse({"evaluation": "federated"}).eval_source == "federated"
    with pytest.raises(ConfigError, match="evaluation='both'"):
        RunConfig.parse({"evaluation": "both"})


def test_simulate_refuses_device_data_in_one_line(tmp_path: Path) -> None:
    from tests.test_fast_failures import run_simulate

    proc, _ = run_simulate("dataset=device", "device-classes=a,b",
                           "max-examples-per-client=100", f"output-dir={tmp_path}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "dataset='device' needs a deployment" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
