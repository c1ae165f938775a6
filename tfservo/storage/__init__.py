"""Storage every part reaches: fsspec filesystems for local paths and URLs, and retries of
their transient errors. Imports only the kernel, so the transform, async invocations and capture share it."""
