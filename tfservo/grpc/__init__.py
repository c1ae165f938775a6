"""The gRPC front door: the server, TF Serving's PredictionService and ModelService, V2's
GRPCInferenceService and grpc.health.v1."""
