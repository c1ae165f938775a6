"""The ResNet-50 notebook's batch transform of JPEGs: ResNet-50 (weights=None: no download)
exported with a JPEG-bytes serving signature that decodes, resizes and lays the batch out NCHW
as the notebook's does, the notebook's b64 `input_handler`, a folder of generated JPEGs of
varying sizes, `tfservo transform --content-type application/x-image`, and the notebook's
read-back of `classes` and `probabilities` from each `.out`.

    .venv/bin/python examples/resnet_jpeg/run.py                  # 20 JPEGs
    .venv/bin/python examples/resnet_jpeg/run.py --images 4 --work /tmp/resnet
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from example_tools import quiet_tensorflow, tfservo

# The notebook's handler pair: the raw JPEG body goes to TF Serving as a b64 instance.
INFERENCE = '''\
import base64
import json


def input_handler(data, context):
    if context.request_content_type == "application/x-image":
        payload = data.read()
        encoded_image = base64.b64encode(payload).decode("utf-8")
        return json.dumps({"instances": [{"b64": encoded_image}]})
    raise ValueError(f"{context.request_content_type} is not supported, send application/x-image")


def output_handler(response, context):
    if response.status_code != 200:
        raise ValueError(response.content.decode("utf-8"))
    return response.content, context.accept_header
'''


def export(bundle: Path) -> None:
    quiet_tensorflow()
    import tensorflow as tf

    resnet = tf.keras.applications.ResNet50(weights=None, classes=1000)

    class JpegResNet(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.resnet = resnet

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
        def serve(self, image_bytes):
            def decode(jpeg):
                image = tf.image.decode_jpeg(jpeg, channels=3)
                return tf.image.resize(tf.cast(image, tf.float32), (224, 224))

            images = tf.map_fn(decode, image_bytes, fn_output_signature=tf.float32)
            nchw = tf.transpose(images, [0, 3, 1, 2])  # the notebook's layout (channels_first)
            # TF's CPU convolutions take NHWC: back again for the Keras model on this machine.
            nhwc = tf.transpose(nchw, [0, 2, 3, 1])
            probabilities = self.resnet(tf.keras.applications.resnet50.preprocess_input(nhwc), training=False)
            return {"classes": tf.argmax(probabilities, axis=1), "probabilities": probabilities}

    module = JpegResNet()
    tf.saved_model.save(module, str(bundle / "resnet50" / "1"), signatures={"serving_default": module.serve.get_concrete_function()})
    (bundle / "code").mkdir(parents=True, exist_ok=True)
    (bundle / "code" / "inference.py").write_text(INFERENCE)


def make_jpegs(folder: Path, count: int) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(3)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        width, height = int(rng.integers(64, 640)), int(rng.integers(64, 480))
        pixels = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=85)
        (folder / f"image-{i:03d}-{width}x{height}.jpg").write_bytes(buffer.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20)
    parser.add_argument("--work", default=None)
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="tfservo-resnet-"))
    print("== 1. ResNet-50 (weights=None) with a JPEG-bytes signature, and the b64 input_handler", flush=True)
    export(work / "bundle")
    make_jpegs(work / "images", args.images)
    print(f"== 2. batch transform of {args.images} JPEGs of varying sizes", flush=True)
    tfservo("transform", str(work / "bundle"), str(work / "images"), str(work / "out"),
            "--content-type", "application/x-image", "--overwrite", "--progress", "none")
    print("== 3. the notebook's read-back: classes and probabilities from each .out", flush=True)
    for path in sorted((work / "out").glob("*.out")):
        prediction = json.loads(path.read_text())["predictions"][0]
        probabilities = prediction["probabilities"]
        print(f"{path.name}: class {prediction['classes']}, probability {max(probabilities):.4f}, "
              f"{len(probabilities)} probabilities summing to {sum(probabilities):.3f}")


if __name__ == "__main__":
    main()
