"""Per-element dead letters from inside Beam's RunInference.

`RunInference(...).with_exception_handling()` sends whatever its DoFn raises to
`failed_inferences` together with the whole batch. To fail only the bad elements, a handler
returns `TaggedOutput(tag, ([element], (type, repr(error), traceback)))` for each of them among
the good results: Beam's exception-handling wrapper yields the DoFn's outputs as they are, so
tagged ones go to the dead-letter output and the rest to the main output. That is right only when

- RunInference has a dead-letter output (without one Beam silently drops tagged values), and
- the handler's results reach RunInference's DoFn unchanged (KeyedModelHandler pairs every
  result with its key, which would put a tagged value in the main output).

Beam gives a ModelHandler no way to ask either, so `dead_letter_tag` reads both off the call
stack, recognising Beam's functions by their code objects. That leans on Beam's internals, so
it is an explicit opt-in (`per_element_failures=True` on the handlers), and it only works on
the Beam versions it was tested with (TESTED_BEAM, the version requirements-dev.lock pins; the
test suite runs it there). Anything else — no opt-in, another Beam version (one warning), a
wrapper of the user's, KeyedModelHandler — answers None, and the caller raises for the whole
batch: Beam's documented contract, where the whole batch goes to `failed_inferences` and the
error names the elements at fault.
"""

from __future__ import annotations

import logging
import sys
import traceback
from types import CodeType, FrameType

import apache_beam
from apache_beam.ml.inference import base
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms import core

from tfservo.batch.worker.failures import ElementErrors, ElementFailure

__all__ = ["RUN_INFERENCE_DEAD_LETTER_TAG", "dead_letter_tag", "with_dead_letters"]

log = logging.getLogger("tfservo.beam")

# The Beam releases whose RunInference internals this module was tested against.
TESTED_BEAM = ("2.77.",)
_warned: set[str] = set()


def supported(beam_version: str) -> bool:
    """Whether per-element dead letters were tested with this Beam version."""
    return beam_version.startswith(TESTED_BEAM)


# RunInference applies ParDo.with_exception_handling() without naming tags, so its dead letters
# go under ParDo's default tag; read from the wrapper itself where it is on this thread's stack.
RUN_INFERENCE_DEAD_LETTER_TAG = "bad"


def _code(owner: object, name: str) -> CodeType | None:
    function = getattr(owner, name, None)
    function = getattr(function, "__func__", function)  # classmethods
    return getattr(function, "__code__", None)


def _nested_code(code: CodeType | None, name: str) -> CodeType | None:
    if code is None:
        return None
    return next((c for c in code.co_consts if isinstance(c, CodeType) and c.co_name == name), None)


_DOFN = getattr(base, "_RunInferenceDoFn", None)
_RUN_INFERENCE = _code(_DOFN, "_run_inference")
_DOFN_PROCESS = _code(_DOFN, "process")
# Calls between RunInference's DoFn and the handler that return the handler's results as they are.
_PASS_THROUGH = frozenset(
    c
    for c in (
        _code(getattr(base, "OOMProtectedFn", None), "__call__"),
        _code(getattr(base, "_PreProcessingModelHandler", None), "run_inference"),
        _code(getattr(base, "_PostProcessingModelHandler", None), "run_inference"),
        _code(getattr(base, "_PrebatchedModelHandler", None), "run_inference"),
    )
    if c is not None
)
_MAYBE_KEYED = _code(base.MaybeKeyedModelHandler, "run_inference")  # passes through unkeyed batches
_WRAPPER = _code(
    getattr(core, "_ExceptionHandlingWrapperDoFn", None), "exception_handling_wrapper_do_fn_custom_process"
)
# with_exception_handling(timeout=...) runs the DoFn on a thread, (use_subprocess=True) in a
# subprocess: the wrapper is then not on this stack, but these are used only under it.
_UNDER_WRAPPER = frozenset(
    c
    for c in (
        _nested_code(_code(getattr(core, "_TimeoutDoFn", None), "process"), "wrapped_process"),
        _code(getattr(core, "_SubprocessDoFn", None), "_remote_process"),
    )
    if c is not None
)


def dead_letter_tag(handler: object) -> str | None:
    """The tag under which `handler.run_inference` (the caller) may return per-element failures,
    or None when they must be raised instead (see the module's docstring)."""
    if not getattr(handler, "per_element_failures", False):
        return None
    if not supported(apache_beam.__version__):
        if apache_beam.__version__ not in _warned:
            _warned.add(apache_beam.__version__)
            log.warning(
                "per_element_failures=True was tested with apache-beam %s, not %s: failed batches go "
                "to failed_inferences whole", " or ".join(v + "x" for v in TESTED_BEAM), apache_beam.__version__,
            )
        return None
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code is not _RUN_INFERENCE:
        if not _passes_results_on(frame, handler):
            return None
        frame = frame.f_back
    process = frame.f_back if frame is not None else None
    if process is None or process.f_code is not _DOFN_PROCESS or process.f_back is None:
        return None
    caller = process.f_back
    if caller.f_code is _WRAPPER:
        tag = getattr(caller.f_locals.get("self"), "_dead_letter_tag", None)
        return tag if isinstance(tag, str) else None
    return RUN_INFERENCE_DEAD_LETTER_TAG if caller.f_code in _UNDER_WRAPPER else None


def _passes_results_on(frame: FrameType, handler: object) -> bool:
    if frame.f_code in _PASS_THROUGH:
        return True
    if frame.f_code is _MAYBE_KEYED:
        return frame.f_locals.get("is_keyed") is False
    return frame.f_locals.get("self") is handler  # the handler's own methods


def with_dead_letters(outputs: list[object], tag: str, batch_size: int, where: str) -> list[object]:
    """A batch's results with each ElementFailure replaced by its dead letter: a batch of one,
    `([element], (ElementErrors, repr(error), traceback))` as Beam writes them, under `tag`."""
    out: list[object] = []
    for output in outputs:
        if isinstance(output, ElementFailure):
            error = ElementErrors([output], batch_size, where)
            error.__cause__ = output.error
            lines = traceback.format_exception(type(error), error, error.__traceback__)
            output = TaggedOutput(tag, ([output.element], (type(error), repr(error), lines)))
        out.append(output)
    return out
