"""SageMaker Asynchronous Inference: calls checked and queued durably (intake.py, queue.py), run
through the same invocation path as /invocations with inputs and answers in S3 or local folders
(runner.py), notifications to SNS or a webhook (notify.py), configured by SageMaker's
AsyncInferenceConfig (config.py)."""
