"""The service layer: the service factory, the invocation path (model, version and method chosen
in one place), TF Serving's API and V2's data plane over the model manager, where a call runs,
multi-model and Target-Model loading, warmup replay, and the metrics every door shares. Above
models, codecs and handlers; below the doors (HTTP, gRPC, async intake, batch, CLI)."""
