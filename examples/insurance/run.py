"""The insurance blog end to end: `;`-separated latin-1 CSV quotes with quotation ids, a
`handler` that returns each id beside its prediction, served as an endpoint and run as a batch
transform with the same bundle.

    .venv/bin/python examples/insurance/run.py                 # 1,000 quotes in 4 files
    .venv/bin/python examples/insurance/run.py --quotes 40 --work /tmp/insurance

Builds the model from code (a logistic regression with fixed weights over four features: age,
vehicle value, years licensed, claims), writes the bundle (model + code/inference.py in the
blog's style) and the quotes, then (1) serves the bundle and posts a few quotes to /invocations,
(2) runs `tfservo transform` over the quote files (MultiRecord, Line) and prints its outputs.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from example_tools import quiet_tensorflow, serving, tfservo

# The blog's handler: the MultiRecord body split on "\n" (each record ends with one), the last,
# empty piece deleted; the quotation id beside each prediction.
HANDLER = '''\
import json

import requests


def handler(data, context):
    if context.request_content_type == "text/csv":
        payload = data.read().decode("latin-1")
        list_of_instances = payload.split("\\n")
        del list_of_instances[-1]
        quotation_ids = []
        instances = []
        for instance in list_of_instances:
            values = instance.split(";")
            quotation_ids.append(values[0])
            instances.append([float(v) for v in values[1:]])
        response = requests.post(context.rest_uri, data=json.dumps({"instances": instances}))
        predictions = response.json()["predictions"]
        lines = [f"{quotation_id},{round(p[0], 4)}" for quotation_id, p in zip(quotation_ids, predictions)]
        return "\\n".join(lines) + "\\n", "text/csv"
    raise ValueError(f"{context.request_content_type} is not supported, send text/csv")
'''

SURNAMES = ["Müller", "Søren", "García", "Lefèvre", "Öztürk", "Dubois", "Núñez", "Björk"]


def build_bundle(bundle: Path) -> None:
    quiet_tensorflow()
    import tensorflow as tf

    class ClaimRisk(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable([[-0.04], [0.00005], [-0.1], [0.8]])
            self.b = tf.Variable([0.5])

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="features")])
        def serve(self, features):
            return {"claim_probability": tf.sigmoid(tf.matmul(features, self.w) + self.b)}

    module = ClaimRisk()
    tf.saved_model.save(module, str(bundle / "claim_risk" / "1"),
                        signatures={"serving_default": module.serve.get_concrete_function()})
    (bundle / "code").mkdir(parents=True, exist_ok=True)
    (bundle / "code" / "inference.py").write_text(HANDLER)


def write_quotes(folder: Path, count: int, files: int = 4) -> list[str]:
    rng = random.Random(7)
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(count):
        quote_id = f"Q-{rng.choice(SURNAMES)}-{i:05d}"
        age, value, licensed, claims = rng.randint(18, 80), rng.randint(3000, 60000), rng.randint(0, 40), rng.randint(0, 3)
        lines.append(f"{quote_id};{age};{value};{licensed};{claims}\n")
    per_file = -(-count // files)
    for f in range(files):
        chunk = lines[f * per_file:(f + 1) * per_file]
        if chunk:
            (folder / f"quotes-{f}.csv").write_bytes("".join(chunk).encode("latin-1"))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quotes", type=int, default=1000)
    parser.add_argument("--work", default=None, help="where the bundle, quotes and outputs go [a temp dir]")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="tfservo-insurance-"))
    bundle, quotes, out = work / "bundle", work / "quotes", work / "out"
    build_bundle(bundle)
    lines = write_quotes(quotes, args.quotes)
    print(f"bundle {bundle}, {len(lines)} quotes in {quotes}")

    import requests

    print("\n== 1. as an endpoint: POST /invocations, text/csv (latin-1), the handler answers id,prediction")
    with serving([str(bundle)]) as server:
        body = "".join(lines[:5]).encode("latin-1")
        answer = requests.post(f"{server.url}/invocations", data=body, headers={"Content-Type": "text/csv"}, timeout=60)
        answer.raise_for_status()
        print(answer.content.decode("utf-8"), end="")  # the handler returns str: UTF-8 on the wire

    print("\n== 2. as a batch transform of the same bundle")
    tfservo("transform", str(bundle), str(quotes), str(out), "--content-type", "text/csv", "--split-type", "Line",
            "--batch-strategy", "MultiRecord", "--assemble-with", "Line", "--accept", "text/csv", "--overwrite",
            "--progress", "none")
    for path in sorted(out.glob("*.out")):
        text = path.read_text(encoding="utf-8")
        print(f"{path.name}: {len(text.splitlines())} lines, first: {text.splitlines()[0]}")


if __name__ == "__main__":
    main()
