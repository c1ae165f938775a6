"""PyTriton: the C++ Triton server and its dynamic batcher in front of the TensorFlow callable.

Usage: python pytriton_server.py MODEL_NAME SAVEDMODEL_DIR HTTP_PORT GRPC_PORT METRICS_PORT
       [MAX_BATCH_SIZE] [MAX_QUEUE_DELAY_MICROS]
Binds MODEL_NAME (input `x` or `images`, float32) and, for images, MODEL_NAME_jpeg (input
`jpeg_b64`, BYTES: base64 JPEG strings decoded in the callable). KServe V2 JSON on /v2/models/…/infer.
"""

from __future__ import annotations

import sys

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from usermodel import SignatureModel, decode_jpegs

name, path = sys.argv[1], sys.argv[2]
http_port, grpc_port, metrics_port = (int(a) for a in sys.argv[3:6])
max_batch = int(sys.argv[6]) if len(sys.argv) > 6 else 32
delay = int(sys.argv[7]) if len(sys.argv) > 7 else 1000

model = SignatureModel(path)
in_shape = tuple(int(d) for d in model.fn.structured_input_signature[1][model.input].shape[1:])
out_shape = tuple(int(d) for d in model.fn.structured_outputs[model.output].shape[1:])
config = ModelConfig(max_batch_size=max_batch, batcher=DynamicBatcher(max_queue_delay_microseconds=delay))


@batch
def infer_arrays(**inputs: np.ndarray) -> dict[str, np.ndarray]:
    return {model.output: model(inputs[model.input])}


@batch
def infer_jpegs(jpeg_b64: np.ndarray) -> dict[str, np.ndarray]:
    return {model.output: model(decode_jpegs([b for b in jpeg_b64[:, 0]]))}


with Triton(
    config=TritonConfig(
        http_address="127.0.0.1", http_port=http_port, grpc_address="127.0.0.1", grpc_port=grpc_port,
        metrics_port=metrics_port, log_verbose=0,
    )
) as triton:
    triton.bind(
        model_name=name, infer_func=infer_arrays,
        inputs=[Tensor(name=model.input, dtype=np.float32, shape=in_shape)],
        outputs=[Tensor(name=model.output, dtype=np.float32, shape=out_shape)],
        config=config, strict=False,
    )
    if len(in_shape) == 3:
        triton.bind(
            model_name=f"{name}_jpeg", infer_func=infer_jpegs,
            inputs=[Tensor(name="jpeg_b64", dtype=np.bytes_, shape=(1,))],
            outputs=[Tensor(name=model.output, dtype=np.float32, shape=out_shape)],
            config=config, strict=False,
        )
    print("pytriton ready", flush=True)
    triton.serve()
