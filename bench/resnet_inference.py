"""code/inference.py of the benchmark's ResNet-50 bundle: JPEGs in, the model's probabilities out.

Requests: `application/json` {"instances": [{"b64": "<base64 JPEG>"}, ...]}, or one JPEG as
`image/jpeg` / `application/x-image` (what `tfservo transform` sends for a folder of .jpg).
input_handler decodes the JPEGs (224×224 RGB) and hands the pixels to TF Serving's predict as
{"instances": uint8 array}: tfservo passes such a request on in-process, unserialized (the
SageMaker container would need `json.dumps({"instances": pixels.tolist()})` instead, and pay
for writing and parsing 150 528 numbers); output_handler passes TF Serving's answer through.
"""

import base64
import json

import numpy as np
import tensorflow as tf


def input_handler(data, context):
    kind = (context.request_content_type or "").split(";")[0].strip().lower()
    if kind in ("image/jpeg", "application/x-image"):
        jpegs = [data.read()]
    elif kind == "application/json":
        jpegs = [base64.b64decode(i["b64"]) for i in json.loads(data.read())["instances"]]
    else:
        raise ValueError(f"send application/json with b64 JPEGs, or image/jpeg; not {kind!r}")
    return {"instances": np.stack([tf.io.decode_jpeg(j, channels=3).numpy() for j in jpegs])}


def output_handler(response, context):
    if response.status_code != 200:
        raise ValueError(response.content.decode())
    return response.content, "application/json"
