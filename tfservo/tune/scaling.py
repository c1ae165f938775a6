"""Scaling rules from a measured per-instance capacity: a KEDA ScaledObject and an HPA for
Kubernetes, and SageMaker's InvocationsPerInstance target-tracking policy.

Both Kubernetes rules scale on `tfservo_requests_in_flight` (requests being answered, summed
over a pod's workers): the concurrency at which one instance still met the latency target is
the per-pod target, so a replica is added before requests start to queue. The files in
`deploy/` are these renderings with the defaults (tests/cli/test_scaling_manifests.py keeps
them equal), and `tfservo tune --emit k8s` writes them with what it measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SAGEMAKER_SAFETY", "ScalingTargets", "hpa_yaml", "instances_for", "keda_yaml", "sagemaker_policy"]

# AWS's load-testing guidance: InvocationsPerInstance = max sustained rps × 60 × a safety factor.
SAGEMAKER_SAFETY = 0.5
IN_FLIGHT = "tfservo_requests_in_flight"


@dataclass(frozen=True)
class ScalingTargets:
    """What a rule scales, and on what: the per-instance concurrency at the latency target."""

    name: str = "tfservo"  # the Deployment (deploy/kubernetes-deployment.yaml)
    namespace: str = "default"
    concurrency: int = 8
    min_replicas: int = 1
    max_replicas: int = 10
    prometheus: str = "http://prometheus-operated.monitoring.svc:9090"
    source: str = "defaults: run `tfservo tune BUNDLE --emit k8s` for a bundle's own"


def keda_yaml(t: ScalingTargets) -> str:
    """A KEDA ScaledObject (keda.sh/v1alpha1) with a Prometheus trigger on requests in flight."""
    query = f'sum({IN_FLIGHT}{{namespace="{t.namespace}", pod=~"{t.name}-.*"}})'
    return f"""\
# KEDA scales the tfservo Deployment on requests in flight per replica ({t.source}).
# Needs KEDA (keda.sh) and a Prometheus scraping the pods' /metrics.
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: {t.name}
  namespace: {t.namespace}
spec:
  scaleTargetRef:
    name: {t.name}
  minReplicaCount: {t.min_replicas}
  maxReplicaCount: {t.max_replicas}
  cooldownPeriod: 300
  triggers:
    - type: prometheus
      metadata:
        serverAddress: {t.prometheus}
        query: '{query}'
        threshold: "{t.concurrency}"
"""


def hpa_yaml(t: ScalingTargets) -> str:
    """An HPA (autoscaling/v2) on the pods' requests in flight, read through a metrics adapter."""
    return f"""\
# A HorizontalPodAutoscaler on requests in flight per pod ({t.source}).
# Needs a custom-metrics adapter (prometheus-adapter) exposing {IN_FLIGHT} per pod.
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {t.name}
  namespace: {t.namespace}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {t.name}
  minReplicas: {t.min_replicas}
  maxReplicas: {t.max_replicas}
  metrics:
    - type: Pods
      pods:
        metric:
          name: {IN_FLIGHT}
        target:
          type: AverageValue
          averageValue: "{t.concurrency}"
  behavior:
    scaleDown:
      stabilizationWindowSeconds: 300
"""


def instances_for(rate: float, per_instance_rps: float) -> int:
    """Instances that serve `rate` requests/s, each at the throughput it sustained at the target."""
    if per_instance_rps <= 0:
        raise ValueError("no throughput met the latency target, so no instance count can serve a rate")
    return max(1, math.ceil(rate / per_instance_rps))


def sagemaker_policy(per_instance_rps: float, endpoint: str = "ENDPOINT", variant: str = "AllTraffic",
                     max_instances: int = 10) -> str:
    """The InvocationsPerInstance target and the boto3 calls that set it."""
    target = max(1, math.floor(per_instance_rps * 60 * SAGEMAKER_SAFETY))
    resource = f"endpoint/{endpoint}/variant/{variant}"
    return f"""\
SageMaker target tracking: InvocationsPerInstance = {target} per minute
  ({per_instance_rps:.1f} req/s sustained × 60 × safety {SAGEMAKER_SAFETY})

import boto3
autoscaling = boto3.client("application-autoscaling")
autoscaling.register_scalable_target(
    ServiceNamespace="sagemaker", ResourceId="{resource}",
    ScalableDimension="sagemaker:variant:DesiredInstanceCount", MinCapacity=1, MaxCapacity={max_instances})
autoscaling.put_scaling_policy(
    PolicyName="tfservo-invocations-per-instance", ServiceNamespace="sagemaker", ResourceId="{resource}",
    ScalableDimension="sagemaker:variant:DesiredInstanceCount", PolicyType="TargetTrackingScaling",
    TargetTrackingScalingPolicyConfiguration={{
        "TargetValue": {target}.0,
        "PredefinedMetricSpecification": {{"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"}},
        "ScaleInCooldown": 300, "ScaleOutCooldown": 60}})
"""
