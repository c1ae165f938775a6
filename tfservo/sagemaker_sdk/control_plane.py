"""The SageMaker API calls the SDK makes (models, endpoint configs, endpoints, transform jobs),
answered on this machine: an endpoint is a `tfservo serve`, a transform job a `tfservo transform`.

Method names and arguments are boto3's `sagemaker` client's, so the SDK's `Session` calls them
unchanged; answers carry the fields the SDK reads. Unknown names raise botocore's ClientError
with SageMaker's ValidationException, as the service does.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from tfservo.batch.job import api_values
from tfservo.sagemaker_sdk.processes import EndpointServer, TransformRun, child_env

__all__ = ["ControlPlane"]

log = logging.getLogger("tfservo.sagemaker_sdk")

_ARN = "arn:aws:sagemaker:{region}:000000000000:{kind}/{name}"


def _invalid(message: str, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": "ValidationException", "Message": message}}, operation)


def _variant_state(name: str, weight: float, instances: int) -> dict[str, object]:
    """A variant as DescribeEndpoint lists it."""
    return {"VariantName": name, "CurrentWeight": weight, "DesiredWeight": weight,
            "CurrentInstanceCount": instances, "DesiredInstanceCount": instances}


def _several(variants: object) -> bool:
    return isinstance(variants, list) and len(variants) > 1


def _not_found(what: str, name: str, operation: str) -> ClientError:
    return ClientError(
        {"Error": {"Code": "ValidationException", "Message": f"Could not find {what} \"{name}\"."}}, operation
    )


def _local(uri: str) -> str:
    """file:///x → /x (tfservo reads local paths and s3:// alike)."""
    return uri[len("file://"):] if uri.startswith("file://") else uri


def _model_data(container: Mapping[str, Any]) -> str:
    if "ModelDataUrl" in container:
        return str(container["ModelDataUrl"])
    source = container.get("ModelDataSource", {}).get("S3DataSource", {})
    if "S3Uri" in source:
        return str(source["S3Uri"])
    raise ValueError("the model has no ModelDataUrl: tfservo serves a model.tar.gz or a model dir")


class ControlPlane:
    """What `sagemaker_client` answers in a tfservo session; holds the running processes."""

    def __init__(self, region: str, env: Mapping[str, str]) -> None:
        self.region = region
        self.env = dict(env)  # for every child: S3 endpoint and credentials
        self._models: dict[str, dict[str, object]] = {}
        self._configs: dict[str, dict[str, object]] = {}
        self._endpoints: dict[str, tuple[EndpointServer, dict[str, object]]] = {}
        self._jobs: dict[str, tuple[TransformRun, dict[str, object]]] = {}
        self._lock = threading.Lock()
        self._work = tempfile.mkdtemp(prefix="tfservo-control-plane-")  # files handed to the servers

    def _arn(self, kind: str, name: str) -> str:
        return _ARN.format(region=self.region, kind=kind, name=name.lower())

    # -- models and endpoint configs -------------------------------------------------------

    def create_model(self, ModelName: str, PrimaryContainer: dict[str, Any] | None = None,
                     Containers: list[dict[str, Any]] | None = None,
                     InferenceExecutionConfig: dict[str, str] | None = None,
                     **kwargs: object) -> dict[str, object]:
        """A model of one container, or an inference pipeline (Containers, Serial or Direct)."""
        containers = [PrimaryContainer] if PrimaryContainer else list(Containers or [])
        if not containers or len(containers) > 15:
            raise _invalid(f"model {ModelName}: 1 to 15 containers, got {len(containers)}", "CreateModel")
        mode = (InferenceExecutionConfig or {}).get("Mode", "Serial")
        if mode not in ("Serial", "Direct"):
            raise _invalid(f"InferenceExecutionConfig Mode is Serial or Direct, not {mode}", "CreateModel")
        if len(containers) > 1 and any(c.get("Mode") == "MultiModel" for c in containers):
            raise _invalid(f"model {ModelName}: a multi-model container cannot be one of several", "CreateModel")
        self._models[ModelName] = {
            "ModelName": ModelName, "ModelArn": self._arn("model", ModelName),
            **({"PrimaryContainer": containers[0]} if PrimaryContainer else {"Containers": containers}),
            **({"InferenceExecutionConfig": InferenceExecutionConfig} if InferenceExecutionConfig else {}),
            "ExecutionRoleArn": kwargs.get("ExecutionRoleArn"), "CreationTime": _now(),
        }
        return {"ModelArn": self._arn("model", ModelName)}

    def _containers(self, model_name: str) -> list[dict[str, Any]]:
        model = self.describe_model(model_name)
        return [model["PrimaryContainer"]] if "PrimaryContainer" in model else list(model["Containers"])

    def _model_args(self, model_name: str) -> tuple[list[str], dict[str, str]]:
        """`serve`'s or `transform`'s MODEL for a model (one bundle, a multi-model root, or a pipeline
        file of its containers) and the environment its containers declare."""
        model = self.describe_model(model_name)
        containers = self._containers(model_name)
        env: dict[str, str] = {}
        for container in containers:
            env.update(container.get("Environment", {}))
        if len(containers) == 1 and "InferenceExecutionConfig" not in model:
            container = containers[0]
            source = _local(_model_data(container))
            if container.get("Mode") == "MultiModel":
                return ["--multi-model", "--model-root", source], env
            return [source], env
        mode = model.get("InferenceExecutionConfig", {}).get("Mode", "Serial").lower()
        pipeline = os.path.join(self._work, f"{model_name}-pipeline.json")
        with open(pipeline, "w") as f:
            json.dump({"mode": mode, "containers": [
                {"model": _local(_model_data(c)), "hostname": c.get("ContainerHostname") or f"container-{i + 1}"}
                for i, c in enumerate(containers)]}, f)
        return [pipeline], env

    def describe_model(self, ModelName: str) -> dict[str, Any]:
        if ModelName not in self._models:
            raise _not_found("model", ModelName, "DescribeModel")
        return dict(self._models[ModelName])

    def delete_model(self, ModelName: str) -> dict[str, object]:
        self._models.pop(ModelName, None)
        return {}

    def create_endpoint_config(self, EndpointConfigName: str, ProductionVariants: list[dict[str, Any]],
                               **kwargs: object) -> dict[str, object]:
        self._configs[EndpointConfigName] = {
            "EndpointConfigName": EndpointConfigName, "ProductionVariants": ProductionVariants,
            "EndpointConfigArn": self._arn("endpoint-config", EndpointConfigName), "CreationTime": _now(),
            **{key: kwargs[key] for key in ("DataCaptureConfig", "AsyncInferenceConfig", "ShadowProductionVariants")
               if kwargs.get(key)},
        }
        return {"EndpointConfigArn": self._arn("endpoint-config", EndpointConfigName)}

    def describe_endpoint_config(self, EndpointConfigName: str) -> dict[str, Any]:
        if EndpointConfigName not in self._configs:
            raise _not_found("endpoint configuration", EndpointConfigName, "DescribeEndpointConfig")
        return dict(self._configs[EndpointConfigName])

    def delete_endpoint_config(self, EndpointConfigName: str) -> dict[str, object]:
        self._configs.pop(EndpointConfigName, None)
        return {}

    # -- endpoints ---------------------------------------------------------------------------

    def create_endpoint(self, EndpointName: str, EndpointConfigName: str, **kwargs: object) -> dict[str, object]:
        """Start `tfservo serve` for the config's variants and return once it answers /ping: one
        variant's bundle (or pipeline), or several variants and shadows through a variants file."""
        config = self.describe_endpoint_config(EndpointConfigName)
        variants = list(config["ProductionVariants"])
        shadows = list(config.get("ShadowProductionVariants") or [])
        if not variants:
            raise _invalid(f"endpoint config {EndpointConfigName} has no ProductionVariants", "CreateEndpoint")
        if len(variants) == 1 and not shadows:
            args, env = self._model_args(variants[0]["ModelName"])
            args += ["--variant-name", variants[0].get("VariantName", "AllTraffic")]
        else:
            args, env = self._variants_args(EndpointName, variants, shadows)
        source = " ".join(a for a in args if not a.startswith("--"))
        if config.get("DataCaptureConfig"):  # captured as SageMaker would, under {destination}/{endpoint}/{variant}/
            capture = os.path.join(self._work, f"{EndpointName}-data-capture.json")
            with open(capture, "w") as f:
                json.dump(config["DataCaptureConfig"], f)
            args += ["--data-capture-config", capture]
        if config.get("AsyncInferenceConfig"):  # InvokeEndpointAsync, its queue kept beside the endpoint's log
            queued = os.path.join(self._work, f"{EndpointName}-async.json")
            with open(queued, "w") as f:
                json.dump(config["AsyncInferenceConfig"], f)
            args += ["--async-inference-config", queued, "--async-state", os.path.join(self._work, f"{EndpointName}-async")]
        if config.get("DataCaptureConfig") or config.get("AsyncInferenceConfig"):
            args += ["--endpoint-name", EndpointName]
        with self._lock:
            if EndpointName in self._endpoints and self._endpoints[EndpointName][0].url:
                raise ClientError(
                    {"Error": {"Code": "ValidationException",
                               "Message": f"Cannot create already existing endpoint \"{EndpointName}\"."}},
                    "CreateEndpoint",
                )
        server = EndpointServer(EndpointName, args, child_env({**self.env, **env}))
        description = {
            "EndpointName": EndpointName, "EndpointArn": self._arn("endpoint", EndpointName),
            "EndpointConfigName": EndpointConfigName, "CreationTime": _now(),
            "ProductionVariants": [_variant_state(v.get("VariantName", "AllTraffic"),
                                                  float(v.get("InitialVariantWeight", 1.0)),
                                                  int(v.get("InitialInstanceCount", 1))) for v in variants],
            **({"ShadowProductionVariants": [_variant_state(v["VariantName"], float(v.get("InitialVariantWeight", 1.0)),
                                                            int(v.get("InitialInstanceCount", 1))) for v in shadows]}
               if shadows else {}),
        }
        with self._lock:
            self._endpoints[EndpointName] = (server, description)
        if server.start():
            log.info("endpoint %s serves %s on %s", EndpointName, source, server.url)
        else:
            log.error("endpoint %s failed: %s", EndpointName, server.failure)
        return {"EndpointArn": description["EndpointArn"]}

    def describe_endpoint(self, EndpointName: str) -> dict[str, object]:
        with self._lock:
            found = self._endpoints.get(EndpointName)
        if found is None:
            raise _not_found("endpoint", EndpointName, "DescribeEndpoint")
        server, description = found
        status = "InService" if server.url else "Failed"
        live = {}
        if server.url:  # the weights now: UpdateEndpointWeightsAndCapacities changes them while it serves
            try:
                with urllib.request.urlopen(server.url + "/endpoint/variants", timeout=10) as answer:
                    now = json.loads(answer.read())
                live = {"ProductionVariants": [
                    _variant_state(v["VariantName"], v["CurrentWeight"], v["CurrentInstanceCount"])
                    for v in now["ProductionVariants"]]} if _several(description["ProductionVariants"]) else {}
            except (OSError, ValueError, KeyError):
                pass  # stopped meanwhile: what was declared
        return {**description, **live, "EndpointStatus": status,
                **({"FailureReason": server.failure} if server.failure else {})}

    def update_endpoint_weights_and_capacities(self, EndpointName: str,
                                               DesiredWeightsAndCapacities: list[dict[str, Any]]) -> dict[str, object]:
        """New weights (and instance counts) for the endpoint's variants, applied by its server
        to every worker at once; requests in flight keep the variant they drew."""
        url = self.endpoint_url(EndpointName)
        if url is None:
            raise _not_found("endpoint", EndpointName, "UpdateEndpointWeightsAndCapacities")
        body = json.dumps({"DesiredWeightsAndCapacities": DesiredWeightsAndCapacities}).encode()
        request = urllib.request.Request(url + "/endpoint/variants/weights", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30):
                pass
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error", str(exc))
            except ValueError:
                message = str(exc)
            raise _invalid(message, "UpdateEndpointWeightsAndCapacities") from None
        return {"EndpointArn": self._arn("endpoint", EndpointName)}

    def _variants_args(self, endpoint: str, variants: list[dict[str, Any]],
                       shadows: list[dict[str, Any]]) -> tuple[list[str], dict[str, str]]:
        """`serve --variants FILE` for an endpoint config of several variants or a shadow."""
        env: dict[str, str] = {}

        def declared(variant: dict[str, Any]) -> dict[str, Any]:
            containers = self._containers(variant["ModelName"])
            if any(c.get("Mode") == "MultiModel" for c in containers):
                raise _invalid(f"variant {variant['VariantName']}: a multi-model container serves as an endpoint's "
                               "only variant", "CreateEndpoint")
            model = self.describe_model(variant["ModelName"])
            own: dict[str, str] = {}
            for container in containers:
                own.update(container.get("Environment", {}))
            env.update(own)
            entry: dict[str, Any] = {
                "name": variant["VariantName"], "weight": float(variant.get("InitialVariantWeight", 1.0)),
                "instances": int(variant.get("InitialInstanceCount", 1)), "environment": own,
            }
            paths = [_local(_model_data(c)) for c in containers]
            if len(paths) == 1 and "InferenceExecutionConfig" not in model:
                entry["model"] = paths[0]
            else:
                entry["models"] = paths
                entry["pipeline"] = model.get("InferenceExecutionConfig", {}).get("Mode", "Serial").lower()
                entry["container_hostnames"] = [c.get("ContainerHostname") or f"container-{i + 1}"
                                                for i, c in enumerate(containers)]
            return entry

        path = os.path.join(self._work, f"{endpoint}-variants.json")
        with open(path, "w") as f:
            json.dump({"variants": [declared(v) for v in variants],
                       "shadow_variants": [declared(v) for v in shadows]}, f)
        return ["--variants", path], env

    def endpoint_url(self, name: str) -> str | None:
        """The URL of a running endpoint this session started, else None."""
        with self._lock:
            found = self._endpoints.get(name)
        return found[0].url or None if found else None

    def delete_endpoint(self, EndpointName: str) -> dict[str, object]:
        with self._lock:
            found = self._endpoints.pop(EndpointName, None)
        if found is None:
            raise _not_found("endpoint", EndpointName, "DeleteEndpoint")
        found[0].stop()
        log.info("endpoint %s stopped", EndpointName)
        return {}

    # -- transform jobs ------------------------------------------------------------------------

    def create_transform_job(
        self,
        TransformJobName: str,
        ModelName: str,
        TransformInput: dict[str, Any],
        TransformOutput: dict[str, Any],
        TransformResources: dict[str, Any],
        BatchStrategy: str | None = None,
        MaxConcurrentTransforms: int | None = None,
        MaxPayloadInMB: int | None = None,
        Environment: dict[str, str] | None = None,
        DataProcessing: dict[str, str] | None = None,
        **kwargs: object,
    ) -> dict[str, object]:
        """Start `tfservo transform` with the job's settings; it runs in the background."""
        with self._lock:
            if TransformJobName in self._jobs:
                raise ClientError(
                    {"Error": {"Code": "ValidationException",
                               "Message": f"Job name must be unique: {TransformJobName} exists."}},
                    "CreateTransformJob",
                )
        model_args, container_env = self._model_args(ModelName)  # a pipeline: the file of its containers
        if model_args[0].startswith("--"):
            raise _invalid(f"model {ModelName} is a multi-model container: a transform job runs one model",
                           "CreateTransformJob")
        source = TransformInput["DataSource"]["S3DataSource"]
        args = [model_args[0], _local(source["S3Uri"]), _local(TransformOutput["S3OutputPath"])]
        # InstanceCount instances on this one machine: the local engine's threads, MaxConcurrentTransforms
        # each (Beam's multi-processing DirectRunner, used before, ran the notebooks' jobs 70x slower)
        instances = int(TransformResources.get("InstanceCount", 1))
        concurrency = MaxConcurrentTransforms * instances if MaxConcurrentTransforms else None
        request = {
            **kwargs, "TransformInput": TransformInput, "TransformOutput": TransformOutput,
            "BatchStrategy": BatchStrategy, "MaxConcurrentTransforms": concurrency,
            "MaxPayloadInMB": MaxPayloadInMB, "DataProcessing": DataProcessing,
        }
        for declared, value in api_values(request):
            if declared.kind is bool:
                args += [declared.flag] if value else []
            else:  # a capture destination may be a file:// URI, as INPUT and OUTPUT are
                args += [declared.flag, _local(str(value))]
        for key, value in {**container_env, **(Environment or {})}.items():
            args += ["--env", f"{key}={value}"]
        run = TransformRun(TransformJobName, args, child_env(self.env))
        description = {
            "TransformJobName": TransformJobName, "TransformJobArn": self._arn("transform-job", TransformJobName),
            "ModelName": ModelName, "TransformInput": TransformInput, "TransformOutput": TransformOutput,
            "TransformResources": TransformResources, "CreationTime": _now(),
        }
        with self._lock:
            self._jobs[TransformJobName] = (run, description)
        return {"TransformJobArn": description["TransformJobArn"]}

    def transform_run(self, name: str) -> TransformRun:
        with self._lock:
            found = self._jobs.get(name)
        if found is None:
            raise _not_found("transform job", name, "DescribeTransformJob")
        return found[0]

    def describe_transform_job(self, TransformJobName: str) -> dict[str, object]:
        run = self.transform_run(TransformJobName)
        with self._lock:
            description = dict(self._jobs[TransformJobName][1])
        description["TransformJobStatus"] = run.status
        description["TransformStartTime"] = datetime.datetime.fromtimestamp(run.started, datetime.timezone.utc)
        if run.ended is not None:
            description["TransformEndTime"] = datetime.datetime.fromtimestamp(run.ended, datetime.timezone.utc)
        if run.failure_reason:
            description["FailureReason"] = run.failure_reason
        if (progress := run.progress) is not None:  # tfservo's own: SageMaker says nothing until the end
            description["TransformJobProgress"] = progress
        return description

    def stop_transform_job(self, TransformJobName: str) -> dict[str, object]:
        self.transform_run(TransformJobName).stop()
        return {}

    def close(self) -> None:
        """Stop every endpoint and transform job this session started."""
        with self._lock:
            endpoints = list(self._endpoints)
            runs = [run for run, _ in self._jobs.values()]
        for name in endpoints:
            self.delete_endpoint(name)
        for run in runs:
            run.stop()
        shutil.rmtree(self._work, ignore_errors=True)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)
