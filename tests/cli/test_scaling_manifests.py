"""deploy/'s scaling rules: rendered from tfservo.tune.scaling (declared once), valid against
the Kubernetes and KEDA API schemas, and a broken one is refused."""

from __future__ import annotations

from pathlib import Path

import yaml
from manifest_schemas import schema_errors

from tfservo.tune.scaling import ScalingTargets, hpa_yaml, keda_yaml, sagemaker_policy

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_deploy_holds_the_default_rendering_of_the_scaling_rules():
    assert (DEPLOY / "keda-scaledobject.yaml").read_text() == keda_yaml(ScalingTargets())
    assert (DEPLOY / "hpa.yaml").read_text() == hpa_yaml(ScalingTargets())


def test_the_deploy_manifests_are_valid_against_their_schemas():
    errors = schema_errors(DEPLOY / "keda-scaledobject.yaml", DEPLOY / "hpa.yaml", DEPLOY / "kubernetes-deployment.yaml")
    assert errors == {
        "keda.sh/v1alpha1/ScaledObject tfservo": None,
        "autoscaling/v2/HorizontalPodAutoscaler tfservo": None,
        "apps/v1/Deployment tfservo": None,
        "v1/Service tfservo": None,
    }


def test_the_rules_scale_the_deployment_on_requests_in_flight(tmp_path):
    targets = ScalingTargets(concurrency=12, max_replicas=7)
    keda = yaml.safe_load(keda_yaml(targets))
    hpa = yaml.safe_load(hpa_yaml(targets))
    deployment = next(d for d in yaml.safe_load_all((DEPLOY / "kubernetes-deployment.yaml").read_text())
                      if d["kind"] == "Deployment")
    assert keda["spec"]["scaleTargetRef"]["name"] == hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    trigger = keda["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus" and trigger["metadata"]["threshold"] == "12"
    assert "tfservo_requests_in_flight" in trigger["metadata"]["query"]
    metric = hpa["spec"]["metrics"][0]["pods"]
    assert metric["metric"]["name"] == "tfservo_requests_in_flight" and metric["target"]["averageValue"] == "12"
    assert keda["spec"]["maxReplicaCount"] == hpa["spec"]["maxReplicas"] == 7


def test_a_broken_manifest_is_refused(tmp_path):
    broken = yaml.safe_load(hpa_yaml(ScalingTargets()))
    broken["spec"]["maxReplicas"] = "ten"
    del broken["spec"]["scaleTargetRef"]
    scaled = yaml.safe_load(keda_yaml(ScalingTargets()))
    scaled["spec"]["triggers"] = {"type": "prometheus"}
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump_all([broken, scaled]))
    errors = schema_errors(path)
    hpa_error = errors["autoscaling/v2/HorizontalPodAutoscaler tfservo"]
    assert hpa_error and "maxReplicas" in hpa_error and "scaleTargetRef" in hpa_error
    keda_error = errors["keda.sh/v1alpha1/ScaledObject tfservo"]
    assert keda_error and "triggers" in keda_error


def test_the_sagemaker_target_is_the_sustained_rate_per_minute_with_aws_safety_factor():
    text = sagemaker_policy(40.0, endpoint="ep", variant="v")
    assert "InvocationsPerInstance = 1200 per minute" in text
    assert '"TargetValue": 1200.0' in text and 'ResourceId="endpoint/ep/variant/v"' in text
    compile(text.split("\n\n", 1)[1], "policy", "exec")  # the printed boto3 calls are Python
