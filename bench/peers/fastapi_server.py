"""A plain FastAPI + TensorFlow endpoint, as a user writes it by hand (TF Serving's JSON shape).

Usage: python fastapi_server.py MODEL_NAME SAVEDMODEL_DIR PORT
"""

from __future__ import annotations

import sys

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from usermodel import SignatureModel, rows_from_instances

name, path, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = SignatureModel(path)
app = FastAPI()


class PredictRequest(BaseModel):
    instances: list


@app.get("/health")
def health() -> dict:
    return {"status": "ok"}


@app.post(f"/v1/models/{name}:predict")
def predict(request: PredictRequest) -> dict:
    return {"predictions": model(rows_from_instances(request.instances)).tolist()}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
