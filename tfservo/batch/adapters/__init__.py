"""Pipeline adapters over the batch worker: Beam RunInference handlers (bundle, remote endpoint),
PredictionLogs and Beam metrics."""
