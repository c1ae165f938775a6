"""A bundle served on Ray Serve: each replica runs the same ASGI app as a `tfservo serve`
worker (SageMaker's /invocations and /ping, TF Serving's REST API, V2's REST), built by the
same `start_worker` from the same settings, behind Ray's HTTP proxy.

    from ray import serve
    from tfservo.ray_serve import build_app

    serve.run(build_app("/models/mlp", config="tuned.toml", max_replicas=4), route_prefix="/")

or, from the command line (Ray's own `serve run`, KubeRay's RayService `import_path`):

    serve run tfservo.ray_serve:app_builder bundle=/models/mlp config=tuned.toml max_replicas=4

Ray scales replicas on requests in flight per replica (`target_ongoing_requests`), which is
the concurrency `tfservo tune` measured at the latency target: pass `tune=OUT/tune.json` to use
it. Each replica is one worker (Ray's replicas replace --workers) with `num_cpus` TensorFlow
threads. Settings come from `config` (the file `serve --config` reads), then `settings`
(flags by name), then the environment, as for `tfservo serve`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.serve import Application

__all__ = ["GRPC_SERVICER_FUNCTIONS", "ReplicaOptions", "app_builder", "build_app", "replica_settings"]

log = logging.getLogger("tfservo.ray_serve")

DEFAULT_TARGET = 8  # requests in flight per replica when no tune.json says otherwise


@dataclass(frozen=True)
class ReplicaOptions:
    """How the deployment is sized and scaled."""

    num_cpus: float = 1.0
    min_replicas: int = 1
    max_replicas: int = 1
    initial_replicas: int | None = None
    target_ongoing_requests: float = DEFAULT_TARGET
    max_ongoing_requests: int = 0  # 0: 4 × the target
    upscale_delay_s: float = 5.0
    downscale_delay_s: float = 30.0
    settings: Mapping[str, Any] = field(default_factory=dict)

    def deployment_options(self) -> dict[str, Any]:
        """Ray Serve's deployment options: a fixed count, or autoscaling on requests in flight."""
        limit = self.max_ongoing_requests or max(1, int(4 * self.target_ongoing_requests))
        options: dict[str, Any] = {"ray_actor_options": {"num_cpus": self.num_cpus}, "max_ongoing_requests": limit,
                                   "health_check_period_s": 2, "health_check_timeout_s": 30,
                                   # tfservo logs its own access lines (--access-log), one per request
                                   "logging_config": {"enable_access_log": False}}
        if self.max_replicas > self.min_replicas:
            options["autoscaling_config"] = {
                "min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                "initial_replicas": self.initial_replicas or self.min_replicas,
                "target_ongoing_requests": self.target_ongoing_requests,
                "upscale_delay_s": self.upscale_delay_s, "downscale_delay_s": self.downscale_delay_s,
                "metrics_interval_s": 1.0, "look_back_period_s": 5.0,
            }
        else:
            options["num_replicas"] = self.min_replicas
        return options


def replica_settings(bundle: str | None, config: str | None, flags: Mapping[str, Any], num_cpus: float) -> Any:
    """The Settings one replica serves with: as `tfservo serve --config CONFIG BUNDLE` resolves
    them, as one worker with `num_cpus` TensorFlow threads and no listeners of its own."""
    from tfservo.core import environment
    from tfservo.core.config_file import read_config_file
    from tfservo.core.settings import resolve_settings

    given: dict[str, Any] = {}
    env = dict(environment.current())
    paths: tuple[str, ...] = (bundle,) if bundle else ()
    if config:
        file = read_config_file(config)
        env.update(file.env)
        given.update(file.flags)
        paths = paths or file.paths
    given.update(flags)
    given.update(workers=1, no_supervisor=True, grpc_port=None)
    given.setdefault("intra_op_threads", max(1, int(num_cpus)))
    return resolve_settings(paths=paths, env=env, serve_default_path=False, **given)


def _asgi_builder(bundle: str | None, config: str | None, flags: Mapping[str, Any], num_cpus: float) -> Any:
    """The function Ray calls on each replica to build its ASGI app (ray.serve.ingress)."""

    def build() -> Any:
        from tfservo.core.logs import quiet_tensorflow, setup_logging
        from tfservo.server.run import start_worker
        from tfservo.service.metrics import Metrics

        quiet_tensorflow()
        settings = replica_settings(bundle, config, flags, num_cpus)
        setup_logging(settings.log_level, settings.log_format, settings.access_log)
        from tfservo.service.preflight import check_bundles

        check_bundles(settings.paths, settings.archive_limits, code_only=settings.pipeline)
        runtime, served, _ = start_worker(settings, port=8000, metrics=Metrics())
        # this module's own list, as imported in the replica: Ray pickles this closure by value,
        # globals and all, while the deployment class comes by reference
        from tfservo import ray_serve

        ray_serve._REPLICA.append(runtime)
        log.info("replica serving %s", ", ".join(settings.paths))
        return served

    return build


# This replica's runtime, once its builder ran (one per replica process).
_REPLICA: list[Any] = []

# The gRPC services Ray's proxy serves for these deployments (serve.start(grpc_options=...)).
GRPC_SERVICER_FUNCTIONS = ["tensorflow_serving.apis.prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server"]


class _PredictionMethods:
    """TF Serving's PredictionService as deployment methods, for Ray Serve's gRPC proxy (which
    calls a deployment's method by the RPC's name): each runs through the replica's own
    PredictionServicer, the one `tfservo serve`'s gRPC door runs, and a ServingError sets its
    gRPC status on Ray's context as the door would."""

    _servicer: Any = None

    def _prediction(self) -> Any:
        if self._servicer is None:
            from tfservo.grpc.tfserving import PredictionServicer
            from tfservo.service.queued_calls import QueuedCalls

            runtime = _REPLICA[0]
            api = runtime.service.api
            self._servicer = PredictionServicer(api, runtime.placements.grpc,
                                                QueuedCalls(api, batched=runtime.service.batches, gather=False))
        return self._servicer

    async def _run(self, rpc: str, call: Any, empty: Any, grpc_context: Any) -> Any:
        import asyncio

        from tfservo.core.errors import ServingError
        from tfservo.grpc.tfserving import grpc_status

        try:
            result = call()
            return await result if asyncio.iscoroutine(result) else result
        except ServingError as exc:
            if grpc_context is not None:
                grpc_context.set_code(grpc_status(exc.code))
                grpc_context.set_details(exc.message)
            log.info("grpc %s through Ray: %s", rpc, exc.message)
            return empty

    async def Predict(self, request: Any, grpc_context: Any = None) -> Any:
        from tensorflow_serving.apis import predict_pb2

        return await self._run("Predict", lambda: self._prediction().predict(request),
                               predict_pb2.PredictResponse(), grpc_context)

    async def Classify(self, request: Any, grpc_context: Any = None) -> Any:
        import asyncio

        from tensorflow_serving.apis import classification_pb2

        return await self._run("Classify", lambda: asyncio.to_thread(self._prediction().classify, request),
                               classification_pb2.ClassificationResponse(), grpc_context)

    async def Regress(self, request: Any, grpc_context: Any = None) -> Any:
        import asyncio

        from tensorflow_serving.apis import regression_pb2

        return await self._run("Regress", lambda: asyncio.to_thread(self._prediction().regress, request),
                               regression_pb2.RegressionResponse(), grpc_context)

    async def GetModelMetadata(self, request: Any, grpc_context: Any = None) -> Any:
        import asyncio

        from tensorflow_serving.apis import get_model_metadata_pb2

        return await self._run("GetModelMetadata", lambda: asyncio.to_thread(self._prediction().metadata, request),
                               get_model_metadata_pb2.GetModelMetadataResponse(), grpc_context)


def build_app(bundle: str | None = None, *, config: str | None = None, settings: Mapping[str, Any] | None = None,
              options: ReplicaOptions | None = None, tune: str | None = None, name: str = "tfservo") -> Application:
    """A Ray Serve application serving `bundle` (or the paths `config` names).

    `tune`: a tune.json `tfservo tune` wrote; its per-instance concurrency at the target becomes
    `target_ongoing_requests` (unless `options` sets one other than the default)."""
    from ray import serve

    options = options or ReplicaOptions()
    if tune and options.target_ongoing_requests == DEFAULT_TARGET:
        options = _with_tuned_target(options, tune)
    builder = _asgi_builder(bundle, config, dict(settings or {}), options.num_cpus)
    deployment = serve.deployment(name=name, **options.deployment_options())(serve.ingress(builder)(_PredictionMethods))
    return deployment.bind()


def _with_tuned_target(options: ReplicaOptions, tune: str) -> ReplicaOptions:
    from dataclasses import replace

    from tfservo.core.settings import ConfigError

    try:
        with open(tune, encoding="utf-8") as f:
            chosen = json.load(f).get("chosen") or {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"tune={tune}: cannot read it as tfservo tune's tune.json ({exc})") from None
    target = chosen.get("concurrency_at_target")
    if not target:
        raise ConfigError(f"tune={tune} holds no measured concurrency at the target; run tfservo tune again")
    return replace(options, target_ongoing_requests=float(target))


_INTS = {"min_replicas", "max_replicas", "initial_replicas", "max_ongoing_requests"}
_FLOATS = {"num_cpus", "target_ongoing_requests", "upscale_delay_s", "downscale_delay_s"}


def app_builder(args: Mapping[str, str]) -> Application:
    """`serve run tfservo.ray_serve:app_builder bundle=PATH [config=FILE] [tune=FILE]
    [num_cpus=N] [min_replicas=N] [max_replicas=N] [target_ongoing_requests=N] ...`: the
    arguments Ray passes as text; any other key is a tfservo setting (flag name, e.g. batching=off)."""
    from tfservo.core.settings import ConfigError

    values = dict(args)
    bundle, config, tune = values.pop("bundle", None), values.pop("config", None), values.pop("tune", None)
    name = values.pop("name", "tfservo")
    sizing: dict[str, Any] = {}
    for key in list(values):
        try:
            if key in _INTS:
                sizing[key] = int(values.pop(key))
            elif key in _FLOATS:
                sizing[key] = float(values.pop(key))
        except ValueError:
            raise ConfigError(f"{key}={args[key]!r} is not a number") from None
    if not bundle and not config:
        raise ConfigError("name the bundle: serve run tfservo.ray_serve:app_builder bundle=PATH (or config=FILE)")
    flags = {key.replace("-", "_"): value for key, value in values.items()}
    return build_app(bundle, config=config, settings=flags, options=ReplicaOptions(**sizing), tune=tune, name=name)
