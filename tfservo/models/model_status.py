"""GetModelStatus: the states of a model's versions, as TF Serving's ServableStateMonitor reports them.

TF Serving reports every version it has seen, in whatever state: a version whose load (or
warmup) failed is END with that error's own code and message (get_model_status_impl.cc,
util/status_util.cc); only a version it never saw is NOT_FOUND. REST (`GET /v1/models/{m}`)
and gRPC (`ModelService.GetModelStatus`) both answer with this one document.
"""

from __future__ import annotations

from tfservo.core.errors import NotFound
from tfservo.core.request_labels import note_version
from tfservo.models.servables import ModelManager, ServableVersion

__all__ = ["model_status", "version_statuses"]


def model_status(manager: ModelManager, name: str, version: int | None, label: str | None) -> dict[str, object]:
    """The status document (GetModelStatusResponse as JSON) of the versions a request names."""
    return {
        "model_version_status": [
            {
                "version": str(v.version),
                "state": v.state.value,
                "status": {"error_code": v.error_code.name, "error_message": v.error or ""},
            }
            for v in version_statuses(manager, name, version, label)
        ]
    }


def version_statuses(
    manager: ModelManager, name: str, version: int | None, label: str | None
) -> list[ServableVersion]:
    """The version asked for (by number or label, in any state), else all of them, newest first."""
    try:
        served = manager.model(name)
    except NotFound:
        names = ", ".join(manager.model_names()) or "none"
        raise NotFound(f"Could not find any versions of model {name}; served models: {names}") from None
    if label is not None:
        version = served.labelled(label)
    if version is None:
        versions = [sv for _, sv in sorted(served.versions.items(), reverse=True)]
        if not versions:
            raise NotFound(f"Could not find any versions of model {name}")
        return versions
    sv = served.versions.get(version)
    if sv is None:
        known = ", ".join(str(v) for v in sorted(served.versions)) or "none"
        raise NotFound(f"Could not find version {version} of model {name}; its versions: {known}")
    note_version(name, sv.version)
    return [sv]
