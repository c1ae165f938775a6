"""Who may call: SigV4 signatures on SageMaker's runtime API (and, in time, API keys with
scopes on every other door). The checks raise typed errors; each door answers them in its
protocol's shape."""
