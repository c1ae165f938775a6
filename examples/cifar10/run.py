"""The CIFAR-10 notebook end to end on one machine: a learnable 10-class 32×32 PNG data set
generated from code and written as TFRecords, the notebook's Keras CNN trained data-parallel
across two local worker processes (tf.distribute.MultiWorkerMirroredStrategy, the role Horovod
plays in the notebook), exported as a bundle whose inference.py decodes application/x-image
PNGs, a batch transform of the test PNGs, `tfservo evaluate` (accuracy, per-class table,
confusion-matrix PNG), then real-time predictions on raw PNG bytes against `tfservo serve`.

    .venv/bin/python examples/cifar10/run.py                      # 5,000 train / 1,000 test images
    .venv/bin/python examples/cifar10/run.py --train 1000 --test 100 --epochs 2 --work /tmp/cifar
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from example_tools import quiet_tensorflow, serving, tfservo

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

# The notebook's handler pair, for raw PNG bodies.
INFERENCE = '''\
import io
import json

import numpy as np
from PIL import Image


def input_handler(data, context):
    if context.request_content_type == "application/x-image":
        image = Image.open(io.BytesIO(data.read())).convert("RGB").resize((32, 32))
        pixels = np.asarray(image, dtype=np.float32) / 255.0
        return json.dumps({"instances": [pixels.tolist()]})
    raise ValueError(f"{context.request_content_type} is not supported, send application/x-image")


def output_handler(response, context):
    if response.status_code != 200:
        raise ValueError(response.content.decode("utf-8"))
    return response.content, context.accept_header
'''


def draw(label: int, rng) -> bytes:
    """A 32×32 PNG of class `label`: its own colour and stripe direction, shifted and noisy."""
    import numpy as np
    from PIL import Image

    hue = np.array([[255, 60, 60], [60, 255, 60], [60, 60, 255], [255, 255, 60], [255, 60, 255],
                    [60, 255, 255], [255, 160, 60], [160, 60, 255], [128, 128, 128], [255, 255, 255]][label], np.float32)
    y, x = np.mgrid[0:32, 0:32]
    angle = label * np.pi / 10
    stripes = 0.5 + 0.5 * np.sin((x * np.cos(angle) + y * np.sin(angle)) / 2.5 + rng.uniform(0, 6.28))
    pixels = stripes[..., None] * hue * rng.uniform(0.6, 1.0) + rng.normal(0, 25, (32, 32, 3))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def generate(work: Path, train: int, test: int) -> None:
    """train.tfrecords (PNG bytes + label, as generate_cifar10_tfrecords.py writes) and test/*.png."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    with tf.io.TFRecordWriter(str(work / "train.tfrecords")) as writer:
        for i in range(train):
            label = i % 10
            example = tf.train.Example(features=tf.train.Features(feature={
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[draw(label, rng)])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }))
            writer.write(example.SerializeToString())
    (work / "test").mkdir(exist_ok=True)
    for i in range(test):
        label = i % 10
        (work / "test" / f"{i:05d}_{CLASSES[label]}.png").write_bytes(draw(label, rng))


def cnn():
    """The notebook's Keras CNN."""
    import tensorflow as tf

    layers = tf.keras.layers
    return tf.keras.Sequential([
        layers.Input((32, 32, 3), name="inputs"),
        layers.Conv2D(32, 3, padding="same", activation="relu"), layers.Conv2D(32, 3, activation="relu"),
        layers.MaxPooling2D(), layers.Dropout(0.25),
        layers.Conv2D(64, 3, padding="same", activation="relu"), layers.Conv2D(64, 3, activation="relu"),
        layers.MaxPooling2D(), layers.Dropout(0.25),
        layers.Flatten(), layers.Dense(512, activation="relu"), layers.Dropout(0.5),
        layers.Dense(10, activation="softmax"),
    ])


def train_worker(work: Path, index: int, ports: list[int], epochs: int, batch: int) -> None:
    """One worker of the data-parallel job (TF_CONFIG names both)."""
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]}, "task": {"type": "worker", "index": index},
    })
    quiet_tensorflow()
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    def parse(record):
        features = tf.io.parse_single_example(record, {"image": tf.io.FixedLenFeature([], tf.string),
                                                        "label": tf.io.FixedLenFeature([], tf.int64)})
        image = tf.cast(tf.io.decode_png(features["image"], channels=3), tf.float32) / 255.0
        return tf.reshape(image, (32, 32, 3)), features["label"]

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA  # one file
    data = (tf.data.TFRecordDataset(str(work / "train.tfrecords")).map(parse).shuffle(2048, seed=1)
            .repeat().batch(batch * len(ports), drop_remainder=True).with_options(options))
    count = sum(1 for _ in tf.data.TFRecordDataset(str(work / "train.tfrecords")))
    global_batch = batch * len(ports)
    with strategy.scope():
        model = cnn()
        first = [tf.Variable(tf.zeros_like(v), trainable=False) for v in model.trainable_variables]
        second = [tf.Variable(tf.zeros_like(v), trainable=False) for v in model.trainable_variables]
        step_count = tf.Variable(0.0, trainable=False)
    batches = iter(strategy.experimental_distribute_dataset(data))

    # A plain training step (Keras 3's fit does not take this strategy's per-replica batches):
    # gradients summed across the workers, then the same Adam update on every replica.
    @tf.function
    def train_step(iterator):
        def replica_step(images, labels):
            with tf.GradientTape() as tape:
                probabilities = model(images, training=True)
                loss = tf.reduce_sum(tf.keras.losses.sparse_categorical_crossentropy(labels, probabilities))
                loss = loss / global_batch
            grads = tape.gradient(loss, model.trainable_variables)
            grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)
            step_count.assign_add(1.0)
            correction = tf.sqrt(1.0 - 0.999**step_count) / (1.0 - 0.9**step_count)
            for var, m, v, grad in zip(model.trainable_variables, first, second, grads):
                m.assign(0.9 * m + 0.1 * grad)
                v.assign(0.999 * v + 0.001 * tf.square(grad))
                var.assign_sub(1e-3 * correction * m / (tf.sqrt(v) + 1e-7))
            hits = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(probabilities, axis=1), labels), tf.float32))
            return loss, hits

        loss, hits = strategy.run(replica_step, args=next(iterator))
        return (strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None),
                strategy.reduce(tf.distribute.ReduceOp.SUM, hits, axis=None))

    steps = max(1, count // global_batch)
    for epoch in range(1, epochs + 1):
        total_loss = total_hits = 0.0
        for _ in range(steps):
            loss, hits = train_step(batches)
            total_loss += float(loss)
            total_hits += float(hits)
        if index == 0:
            print(f"epoch {epoch}/{epochs}: loss {total_loss / steps:.4f}, "
                  f"training accuracy {total_hits / (steps * global_batch):.3f}", flush=True)

    # Every worker saves (collectives need all of them); only the chief's copy is the bundle's.
    export(model, work / "bundle" / "cifar10" / "1" if index == 0 else Path(tempfile.mkdtemp()) / "1")


def export(model, target: Path) -> None:
    """The CNN as a SavedModel version dir: 32x32x3 floats in, class probabilities out."""
    import tensorflow as tf

    class Serving(tf.Module):
        def __init__(self, net) -> None:
            super().__init__()
            self.net = net

        @tf.function(input_signature=[tf.TensorSpec([None, 32, 32, 3], tf.float32, name="inputs")])
        def serve(self, inputs):
            return {"probabilities": self.net(inputs, training=False)}

    module = Serving(model)
    tf.saved_model.save(module, str(target), signatures={"serving_default": module.serve.get_concrete_function()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=5000)
    parser.add_argument("--test", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32, help="per worker")
    parser.add_argument("--work", default=None)
    parser.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ports", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="tfservo-cifar10-"))
    if args.worker_index is not None:
        train_worker(work, args.worker_index, [int(p) for p in args.ports.split(",")], args.epochs, args.batch)
        return
    work.mkdir(parents=True, exist_ok=True)
    quiet_tensorflow()
    print(f"== 1. {args.train} training images as TFRecords, {args.test} test PNGs in {work}", flush=True)
    generate(work, args.train, args.test)

    print("== 2. training across 2 worker processes (MultiWorkerMirroredStrategy)", flush=True)
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    command = [sys.executable, __file__, "--work", str(work), "--epochs", str(args.epochs), "--batch", str(args.batch),
               "--ports", ",".join(map(str, ports))]
    workers = [subprocess.Popen([*command, "--worker-index", str(i)]) for i in range(2)]
    if any(w.wait() != 0 for w in workers):
        raise SystemExit("training failed")
    bundle = work / "bundle"
    (bundle / "code").mkdir(parents=True, exist_ok=True)
    (bundle / "code" / "inference.py").write_text(INFERENCE)

    print("\n== 3. batch transform of the test PNGs", flush=True)
    tfservo("transform", str(bundle), str(work / "test"), str(work / "out"), "--content-type", "application/x-image",
            "--overwrite", "--progress", "none")

    print("\n== 4. evaluate", flush=True)
    tfservo("evaluate", str(work / "out"), "--label-from-name", r"^\d+_([a-z]+)\.png$",
            "--classes", ",".join(CLASSES), "--plot", str(work / "confusion_matrix.png"),
            "--json", str(work / "metrics.json"))

    print("\n== 5. real-time predictions on raw PNG bytes", flush=True)
    import requests

    with serving([str(bundle)]) as server:
        for path in sorted((work / "test").glob("*.png"))[:5]:
            answer = requests.post(f"{server.url}/invocations", data=path.read_bytes(),
                                   headers={"Content-Type": "application/x-image"}, timeout=60)
            answer.raise_for_status()
            scores = answer.json()["predictions"][0]
            best = max(range(10), key=scores.__getitem__)
            print(f"{path.name}: {CLASSES[best]} ({scores[best]:.2f})")


if __name__ == "__main__":
    main()
