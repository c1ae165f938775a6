"""KServe's Python model server with a custom kserve.Model, as KServe's docs write one (V1 protocol).

Usage: python kserve_server.py MODEL_NAME SAVEDMODEL_DIR HTTP_PORT GRPC_PORT
"""

from __future__ import annotations

import sys
from typing import Dict

import kserve
from usermodel import SignatureModel, rows_from_instances


class TFModel(kserve.Model):
    def __init__(self, name: str, path: str) -> None:
        super().__init__(name)
        self.path = path
        self.model: SignatureModel | None = None
        self.load()

    def load(self) -> bool:
        self.model = SignatureModel(self.path)
        self.ready = True
        return self.ready

    def predict(self, payload: Dict, headers: Dict[str, str] = None) -> Dict:
        return {"predictions": self.model(rows_from_instances(payload["instances"])).tolist()}


if __name__ == "__main__":
    name, path, http_port, grpc_port = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    server = kserve.ModelServer(
        http_port=http_port, grpc_port=grpc_port, enable_grpc=False, enable_latency_logging=False
    )
    server.start([TFModel(name, path)])
