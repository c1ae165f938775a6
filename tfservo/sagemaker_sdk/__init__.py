"""The SageMaker Python SDK (v2) on tfservo: pass `Session()` as `sagemaker_session=` and
`deploy(instance_type='local')`, `Predictor`, `MultiDataModel` and `transformer(...).transform()`
run on this machine with `tfservo serve` and `tfservo transform`, without Docker or AWS.

Needs the optional extra: `pip install 'tfservo[sagemaker]'`.
"""

from tfservo.sagemaker_sdk.session import Session

__all__ = ["Session"]
