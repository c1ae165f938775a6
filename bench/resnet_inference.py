"""code/inference.py of the benchmark's ResNet-50 bundle: JPEGs in, the model's probabilities out.

Request: {"instances": [{"b64": "<base64 JPEG>"}, ...]} (224×224 RGB). input_handler decodes the
JPEGs and hands the pixels to TF Serving's predict as a JSON request (uint8 values, which the
float32 signature takes as numbers); output_handler passes TF Serving's answer through.
"""

import base64
import json

import numpy as np
import orjson
import tensorflow as tf


def input_handler(data, context):
    if context.request_content_type != "application/json":
        raise ValueError(f"send application/json, not {context.request_content_type}")
    instances = json.loads(data.read())["instances"]
    pixels = np.stack([tf.io.decode_jpeg(base64.b64decode(i["b64"]), channels=3).numpy() for i in instances])
    return orjson.dumps({"instances": pixels}, option=orjson.OPT_SERIALIZE_NUMPY)


def output_handler(response, context):
    if response.status_code != 200:
        raise ValueError(response.content.decode())
    return response.content, "application/json"
