"""Build a tiny image bundle with a b64 handler, and a folder of JPEG/PNG images to transform.

`DIR/model/image_stats/00000001`: decodes JPEG/PNG/GIF/BMP bytes (a DT_STRING input, sent as
TF Serving's {"b64": ...}) and answers each image's mean RGB and brightness.
`DIR/model/code/inference.py`: handler(data, context) that posts the raw image body to
context.rest_uri, as SageMaker image handlers do. `DIR/images/`: solid-colour pictures in
nested folders. Everything is made from code: no downloads.

    .venv/bin/python examples/build_image_example.py /tmp/image-example
"""

from __future__ import annotations

import os
import sys
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if __name__ == "__main__":
    from tfservo.core.logs import quiet_tensorflow

    quiet_tensorflow()  # TF 2.21's native start-up lines

import tensorflow as tf

HANDLER = '''\
"""SageMaker-style image handler: raw JPEG/PNG body in, the model's JSON answer out."""

import base64
import json

import requests


def handler(data, context):
    image = data.read()
    if not image:
        raise ValueError("empty request body: send one image")
    request = {"instances": [{"b64": base64.b64encode(image).decode()}]}
    response = requests.post(context.rest_uri, data=json.dumps(request))
    if response.status_code != 200:
        raise ValueError(f"the model could not read this {context.request_content_type} image: {response.text}")
    return response.content, "application/json"
'''

# (folder/name, RGB colour); a colour per image so each answer is known
IMAGES = [
    ("cats/black.jpg", (0, 0, 0)),
    ("cats/grey.png", (128, 128, 128)),
    ("cats/white.jpg", (255, 255, 255)),
    ("dogs/red.png", (255, 0, 0)),
    ("dogs/green.jpg", (0, 200, 0)),
    ("dogs/nested/blue.png", (0, 0, 255)),
]


class ImageStats(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
    def serve(self, image_bytes):
        def one(data):
            image = tf.io.decode_image(data, channels=3, expand_animations=False)
            return tf.reduce_mean(tf.cast(image, tf.float32), axis=[0, 1])

        mean = tf.map_fn(one, image_bytes, fn_output_signature=tf.TensorSpec([3], tf.float32))
        return {"mean_rgb": mean, "brightness": tf.reduce_mean(mean, axis=1) / 255.0}


def build_model(bundle: str) -> str:
    """Save image_stats version 1 and code/inference.py under `bundle`."""
    module = ImageStats()
    export = os.path.join(bundle, "image_stats", "00000001")
    tf.saved_model.save(module, export, signatures={"serving_default": module.serve.get_concrete_function()})
    code = os.path.join(bundle, "code")
    os.makedirs(code, exist_ok=True)
    with open(os.path.join(code, "inference.py"), "w") as f:
        f.write(textwrap.dedent(HANDLER))
    return bundle


def write_images(folder: str, images=IMAGES, size: tuple[int, int] = (48, 64)) -> list[str]:
    """Solid-colour JPEG/PNG files under `folder`; returns their relative names."""
    names = []
    for name, rgb in images:
        pixels = tf.fill([size[0], size[1], 3], tf.constant(0, tf.uint8)) + tf.constant(rgb, tf.uint8)
        data = tf.io.encode_png(pixels) if name.endswith(".png") else tf.io.encode_jpeg(pixels, quality=95)
        path = os.path.join(folder, *name.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data.numpy())
        names.append(name)
    return names


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "examples/image-example"
    build_model(os.path.join(out, "model"))
    write_images(os.path.join(out, "images"))
    print(f"built {out}/model (image_stats + code/inference.py) and {len(IMAGES)} images in {out}/images")
