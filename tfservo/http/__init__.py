"""The HTTP front door: SageMaker, TF Serving REST, the runtime API, multi-model and V2 routes,
OpenAPI and /docs, and the HTTP protocol guards."""
