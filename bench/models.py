"""Build the benchmark's models and request bodies from code (fixed seeds, no downloads).

- `mlp/1`: a 784-256-256-10 MLP, input `x` float32[-1, 784] → `probabilities` float32[-1, 10].
- `resnet50/1`: `tf.keras.applications.ResNet50(weights=None)`, input `images`
  float32[-1, 224, 224, 3] → `probabilities` float32[-1, 1000]; the bundle's
  `code/inference.py` takes `{"instances": [{"b64": JPEG}]}` and decodes the JPEGs itself.
- `bodies/`: the request bodies every load run sends (one file per workload and protocol).

Usage: python bench/models.py WORKDIR   (skips what already exists)
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

MLP_DIM, HIDDEN, CLASSES = 784, 256, 10
IMAGE = 224
SEED = 20240601

HANDLER = Path(__file__).with_name("resnet_inference.py")


def build_mlp(path: Path) -> Path:
    """The MLP as a tf.Module SavedModel with fixed random weights."""
    import tensorflow as tf

    rng = np.random.default_rng(SEED)

    def dense(n_in: int, n_out: int) -> tuple[tf.Variable, tf.Variable]:
        w = rng.normal(0, (2.0 / n_in) ** 0.5, size=(n_in, n_out)).astype(np.float32)
        return tf.Variable(w), tf.Variable(np.zeros(n_out, np.float32))

    class MLP(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1, self.l2, self.l3 = dense(MLP_DIM, HIDDEN), dense(HIDDEN, HIDDEN), dense(HIDDEN, CLASSES)

        @tf.function(input_signature=[tf.TensorSpec([None, MLP_DIM], tf.float32, name="x")])
        def serve(self, x):
            h = tf.nn.relu(x @ self.l1[0] + self.l1[1])
            h = tf.nn.relu(h @ self.l2[0] + self.l2[1])
            return {"probabilities": tf.nn.softmax(h @ self.l3[0] + self.l3[1])}

    module = MLP()
    export = path / "mlp" / "1"
    tf.saved_model.save(module, str(export), signatures={"serving_default": module.serve.get_concrete_function()})
    return export


def build_resnet50(path: Path) -> Path:
    """ResNet-50 (random weights) behind a float32 image signature, plus the JPEG handler."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(SEED)
    model = keras.applications.ResNet50(weights=None)

    # Keras's own exporter: a tf.Module wrapped around a Keras 3 model and written with
    # tf.saved_model.save loads in TF1 graph mode with half its variables never restored.
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        name="serving_default",
        fn=lambda images: {"probabilities": model(images, training=False)},
        input_signature=[tf.TensorSpec([None, IMAGE, IMAGE, 3], tf.float32, name="images")],
    )
    export = path / "resnet50" / "1"
    archive.write_out(str(export), verbose=False)
    code = path / "resnet50" / "code"
    code.mkdir(parents=True, exist_ok=True)
    shutil.copy(HANDLER, code / "inference.py")
    return export


def synthetic_jpeg(seed: int) -> bytes:
    """A 224×224 photo-like JPEG (smooth gradients and shapes, so it compresses like a photo)."""
    from PIL import Image, ImageDraw, ImageFilter

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:IMAGE, 0:IMAGE].astype(np.float32) / IMAGE
    base = np.stack([x, y, (x + y) / 2], axis=-1) * rng.uniform(80, 200, 3) + rng.uniform(0, 50, 3)
    img = Image.fromarray(np.clip(base + rng.normal(0, 6, base.shape), 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(12):
        x0, y0 = rng.integers(0, IMAGE, 2)
        draw.ellipse([x0, y0, x0 + rng.integers(10, 80), y0 + rng.integers(10, 80)], fill=tuple(rng.integers(0, 255, 3)))
    buf = io.BytesIO()
    img.filter(ImageFilter.GaussianBlur(1)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def mlp_instance(seed: int = 1) -> list[float]:
    return np.random.default_rng(seed).random(MLP_DIM, dtype=np.float32).round(4).tolist()


def write_bodies(path: Path) -> dict[str, str]:
    """Request bodies: MLP one 1×784 instance; ResNet b64 JPEG and float JSON, per protocol."""
    out = path / "bodies"
    out.mkdir(parents=True, exist_ok=True)
    row = mlp_instance()
    jpeg = synthetic_jpeg(7)
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"), dtype=np.float32)
    image = pixels.tolist()
    b64 = base64.b64encode(jpeg).decode()
    bodies = {
        # TF Serving REST (tfservo, KServe V1, FastAPI): {"instances": [...]}
        "mlp.tfs.json": {"instances": [row]},
        "resnet_float.tfs.json": {"instances": [image]},
        "resnet_b64.tfs.json": {"instances": [{"b64": b64}]},
        # KServe V2 / Triton: {"inputs": [{name, shape, datatype, data}]}
        "mlp.v2.json": {"inputs": [{"name": "x", "shape": [1, MLP_DIM], "datatype": "FP32", "data": row}]},
        "resnet_float.v2.json": {
            "inputs": [{"name": "images", "shape": [1, IMAGE, IMAGE, 3], "datatype": "FP32", "data": pixels.ravel().tolist()}]
        },
        "resnet_b64.v2.json": {"inputs": [{"name": "jpeg_b64", "shape": [1, 1], "datatype": "BYTES", "data": [b64]}]},
    }
    paths = {}
    for name, doc in bodies.items():
        p = out / name
        p.write_text(json.dumps(doc, separators=(",", ":")))
        paths[name] = str(p)
    (out / "image.jpg").write_bytes(jpeg)
    return paths


def build_all(workdir: str | os.PathLike[str]) -> dict[str, str]:
    """Build whatever is missing under `workdir`; returns the paths the benchmark uses."""
    root = Path(workdir).resolve()
    models = root / "models"
    models.mkdir(parents=True, exist_ok=True)
    if not (models / "mlp" / "1" / "saved_model.pb").exists():
        build_mlp(models)
    if not (models / "resnet50" / "1" / "saved_model.pb").exists():
        build_resnet50(models)
    # The handler is re-copied every time, so edits to bench/resnet_inference.py take effect.
    shutil.copy(HANDLER, models / "resnet50" / "code" / "inference.py")
    bodies = write_bodies(root)
    return {
        "mlp": str(models / "mlp"),
        "mlp_version": str(models / "mlp" / "1"),
        "resnet50": str(models / "resnet50"),
        "resnet50_version": str(models / "resnet50" / "1"),
        **{f"body:{k}": v for k, v in bodies.items()},
        "jpeg": str(root / "bodies" / "image.jpg"),
    }


if __name__ == "__main__":
    from tfservo.core.logs import quiet_tensorflow

    quiet_tensorflow()
    print(json.dumps(build_all(sys.argv[1] if len(sys.argv) > 1 else "bench/work"), indent=1))
