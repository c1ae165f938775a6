"""`BundleModelHandler`: a Beam RunInference ModelHandler for any bundle `tfservo serve` accepts.

    import apache_beam as beam
    from apache_beam.ml.inference.base import RunInference
    from tfservo.beam import BundleModelHandler

    results = examples | RunInference(BundleModelHandler("s3://bucket/model.tar.gz"))

The model is loaded once per worker process (Beam's shared handle), or once per machine with
share_model_across_processes=True; keys work through Beam's KeyedModelHandler and
MaybeKeyedModelHandler. The run_inference logic lives in `ServingModelHandler` and is shared
with the remote handler: only what answers (a LoadedBundle or an endpoint client) differs.
"""

from __future__ import annotations

import inspect
import logging
import pickle
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from apache_beam.ml.inference.base import ModelHandler, PredictionResult

from tfservo.batch.adapters import prediction_log
from tfservo.batch.adapters.beam_dead_letters import dead_letter_tag, with_dead_letters
from tfservo.batch.adapters.beam_metrics import HandlerMetrics
from tfservo.batch.worker.batches import Part, run_batch
from tfservo.batch.worker.failures import ElementErrors, ElementFailure
from tfservo.batch.worker.loaded import LoadedBundle, Selection
from tfservo.batch.worker.target import Target, check_options
from tfservo.core.errors import first_line

__all__ = ["BundleModelHandler", "ServingModelHandler"]

log = logging.getLogger("tfservo.beam")


class ServingModelHandler(ModelHandler[object, object, object]):
    """Batches elements for one signature (or /invocations), runs them, splits results per element.

    Subclasses implement load_model, returning an object with the methods of LoadedBundle
    (target, take_load_millis, predict, classify, regress, invoke).
    """

    def __init__(
        self,
        *,
        model_name: str | None = None,
        version: int | None = None,
        signature_name: str | None = None,
        method: str | None = None,
        content_type: str | None = None,
        accept: str | None = None,
        custom_attributes: str | None = None,
        output: str = "prediction_result",
        min_batch_size: int | None = None,
        max_batch_size: int | None = None,
        max_batch_duration_secs: int | None = None,
        large_model: bool = False,
        model_copies: int | None = None,
        share_model_across_processes: bool = False,
        per_element_failures: bool = False,
        **kwargs: Any,
    ) -> None:
        unknown = sorted(set(kwargs) - _BEAM_OPTIONS)
        if unknown:
            hints = [f"{k} (did you mean {_CLOSE[k]}?)" if k in _CLOSE else k for k in unknown]
            raise TypeError(
                f"{type(self).__name__} got unexpected keyword argument(s): {', '.join(hints)}; it takes "
                "model_name, version, signature_name, method, content_type, accept, custom_attributes, "
                f"output and Beam's batching options ({', '.join(sorted(_BEAM_OPTIONS))})"
            )
        check_options(method, output, content_type, accept)
        super().__init__(
            min_batch_size=min_batch_size,
            max_batch_size=max_batch_size,
            max_batch_duration_secs=max_batch_duration_secs,
            large_model=large_model,
            model_copies=model_copies,
            **kwargs,
        )
        if share_model_across_processes:
            self._share_across_processes = True
        self._selection = Selection(
            model_name, version, signature_name, method, content_type, accept, custom_attributes
        )
        self._output = output
        self._metrics: HandlerMetrics | None = None
        self._origin: str | None = None  # what the handler was made with; a model from elsewhere is named by its source
        self._answering: str | None = None  # the model id of the last batch, to count swaps
        # Opt-in: only the bad elements of a failed batch go to failed_inferences (dead_letters.py).
        self.per_element_failures = per_element_failures

    # -- Beam's ModelHandler interface ------------------------------------------------------

    def run_inference(
        self, batch: Sequence[Any], model: Any, inference_args: dict[str, Any] | None = None
    ) -> Iterable[object]:
        """Run one batch; a failed batch is retried element by element so only the bad ones fail.

        Under RunInference(...).with_exception_handling() each bad element goes to the dead-letter
        output on its own and the good ones come through; otherwise ElementErrors names them.
        """
        self.validate_inference_args(inference_args)
        batch = list(batch)
        if not batch:
            return []
        metrics = self._metrics_cells()
        load_millis = model.take_load_millis()
        if load_millis is not None:
            metrics.model_load_millis.update(load_millis)
        target: Target = model.target()
        self._note_model(target, metrics, len(batch))
        t0 = time.perf_counter()
        failed = len(batch)  # an overload/outage error fails the whole batch
        try:
            outputs = [out for part in run_batch(model, target, batch) for out in self._outputs(target, part)]
            failures = [o for o in outputs if isinstance(o, ElementFailure)]
            failed = len(failures)
        finally:
            metrics.batch(len(batch), time.perf_counter() - t0, failed)
        if not failures:
            return outputs
        tag = dead_letter_tag(self)
        if tag is None:
            raise ElementErrors(failures, len(batch), target.describe()) from failures[0].error
        return with_dead_letters(outputs, tag, len(batch), target.describe())

    def validate_inference_args(self, inference_args: dict[str, object] | None) -> None:
        if inference_args:
            raise ValueError(
                f"tfservo handlers take no inference_args (got {sorted(inference_args)}); choose "
                "the signature and method with signature_name= and method= instead"
            )

    def get_num_bytes(self, batch: Sequence[object]) -> int:
        return sum(_num_bytes(element) for element in batch)

    # -- results ----------------------------------------------------------------------------

    def model_id(self, target: Target) -> str:
        """What PredictionResult.model_id says answered: `name/version`, prefixed with the bundle
        (`SOURCE:name/version`) once a model update (Beam's side input) replaced the bundle the
        handler was made with, so two archives that both hold `model/1` can be told apart."""
        if self._origin is None or target.source == self._origin:
            return target.model_id
        return f"{target.source}:{target.model_id}"

    def _note_model(self, target: Target, metrics: HandlerMetrics, size: int) -> None:
        """Count the batch for its model id, and a swap when the model answering changed."""
        model_id = self.model_id(target)
        metrics.per_model(model_id, size)
        if self._answering is not None and model_id != self._answering:
            metrics.model_swaps.inc()
            log.info("now answering with %s (was %s)", model_id, self._answering)
        self._answering = model_id

    def _outputs(self, target: Target, part: Part) -> list[object]:
        """A part's results as Beam outputs: PredictionResults, or PredictionLogs with
        output="prediction_log"; failed elements stay ElementFailures."""
        model_id = self.model_id(target)
        if self._output == "prediction_log" and part.ok:
            return prediction_log.logs(target, part, model_id)
        return [
            r if isinstance(r, ElementFailure) else PredictionResult(e, r, model_id)
            for e, r in zip(part.elements, part.results)
        ]

    def _metrics_cells(self) -> HandlerMetrics:
        if self._metrics is None:
            self._metrics = HandlerMetrics()
        return self._metrics

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_metrics"] = None  # recreated where the handler runs
        state["_answering"] = None
        return state


class BundleModelHandler(ServingModelHandler):
    """RunInference on a tfservo bundle (local path, model.tar.gz or s3:// URL), loaded in the worker.

    Elements: an input value or a dict of input name → value (predict); a tf.train.Example, its
    serialized bytes or a dict of features (classify, regress, string-input predict); or, with
    content_type=, raw request bodies that go through content conversion and inference.py
    exactly as POST /invocations does. Results: PredictionResult(example, inference, model_id)
    with inference = dict of output name → array (predict), [(label, score), ...] (classify),
    float (regress) or the response body bytes (content_type=); or TF Serving PredictionLog
    protos with output="prediction_log".

    model_name, version, signature_name and method default to what `tfservo serve` picks
    (custom_attributes' tfs-* values, $SAGEMAKER_TFS_DEFAULT_MODEL_NAME, the highest version,
    serving_default, and the signature's own method). min_batch_size, max_batch_size and
    max_batch_duration_secs go to Beam's BatchElements; large_model / model_copies /
    share_model_across_processes load one copy per machine instead of one per process.

    Model updates: under RunInference(..., model_metadata_pcoll=...) (WatchFilePattern, or a side
    input of ModelMetadata from an event) each new model_id (a bundle path or URL) is loaded,
    code/ included, and answers from the next batch on; its results' model_id names it. A bundle
    that fails to load is logged and counted (model_update_failures) and the previous one keeps
    answering. file_system_poll_wait_seconds=N follows new version dirs of the bundle instead, as
    `tfservo serve --file-system-poll-wait-seconds` does (when no version= is pinned).
    """

    def __init__(
        self,
        bundle: str,
        *,
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
        file_system_poll_wait_seconds: float = 0,
        **options: Any,
    ) -> None:
        if not isinstance(bundle, str) or not bundle:
            raise ValueError(f"bundle must be a path or URL string, got {bundle!r}")
        if file_system_poll_wait_seconds < 0:
            raise ValueError(f"file_system_poll_wait_seconds must be 0 (off) or more, got {file_system_poll_wait_seconds}")
        super().__init__(**options)
        self._bundle = bundle
        self._origin = bundle
        self._threads = (intra_op_threads, inter_op_threads)
        self._poll_seconds = file_system_poll_wait_seconds
        self._last_good: tuple[str, LoadedBundle] | None = None

    def load_model(self) -> LoadedBundle:
        """Open the bundle, load its models and resolve what runs (once per worker, shared). After
        a model update whose bundle fails to load, the previous model, with the failure logged."""
        intra, inter = self._threads
        try:
            loaded = LoadedBundle(self._bundle, self._selection, intra_op_threads=intra, inter_op_threads=inter,
                                  poll_seconds=self._poll_seconds)
        except Exception as exc:
            if self._last_good is None or self._last_good[0] == self._bundle:
                raise
            previous, model = self._last_good
            log.error("model update failed: %s could not be loaded (%s); %s keeps answering",
                      self._bundle, first_line(exc), previous)
            self._metrics_cells().model_update_failures.inc()
            self._bundle = previous
            return model
        self._last_good = (self._bundle, loaded)
        return loaded

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_last_good"] = None  # a loaded model stays in its process
        return state

    def update_model_path(self, model_path: str | None = None) -> None:
        """Beam's model refresh (watch_model_pattern / side input) points at a new bundle; an
        empty model_id means the bundle the handler was made with."""
        self._bundle = model_path or self._origin or self._bundle

    def __repr__(self) -> str:
        s = self._selection
        chosen = ", ".join(f"{k}={v!r}" for k, v in vars(s).items() if v is not None)
        return f"BundleModelHandler({self._bundle!r}{', ' + chosen if chosen else ''})"


# Keyword arguments Beam's ModelHandler itself takes (besides the ones named above).
_BEAM_OPTIONS = frozenset(
    name
    for name, param in inspect.signature(ModelHandler.__init__).parameters.items()
    if param.kind is inspect.Parameter.KEYWORD_ONLY
) | {"env_vars"}
_CLOSE = {"signature": "signature_name", "model": "model_name", "model_version": "version", "accept_type": "accept"}


def _num_bytes(element: object) -> int:
    if isinstance(element, np.ndarray):
        return int(element.nbytes)
    if isinstance(element, (bytes, bytearray, str)):
        return len(element)
    if hasattr(element, "ByteSize"):
        return int(element.ByteSize())
    if isinstance(element, Mapping):
        return sum(_num_bytes(v) for v in element.values())
    try:
        return len(pickle.dumps(element))
    except Exception:
        return 0
