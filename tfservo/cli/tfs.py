"""`tensorflow_model_server`: TF Serving's command line, meaning what it means there, over the
same settings resolution and server as `tfservo serve`.

TF Serving parses flags with absl: `--name=value` or `--name value`, booleans also as `--name`,
`--noname`, `--name=true/false`. In TF Serving `--port` is gRPC and `--rest_api_port` REST
(0: no REST — tfservo always serves HTTP, so 0 means 8501 here), and it listens on every
interface. `MODEL_NAME`/`MODEL_BASE_PATH` fill in `--model_name`/`--model_base_path` as TF
Serving's Docker image does. Flags tfservo has no use for are accepted with a warning naming
them; a flag TF Serving does not have stops start-up naming it.
"""

from __future__ import annotations

import difflib
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tfservo.core.config_file import ConfigFile, read_config_file
from tfservo.core.environment import export
from tfservo.core.logs import quiet_tensorflow, setup_logging
from tfservo.core.settings import (
    ConfigError,
    Settings,
    environment,
    log_level_from_env,
    resolve_settings,
    tfs_flags,
)

__all__ = ["TF_SERVING_FLAGS", "parse_tfs_args", "run", "settings_from_tfs_args"]

log = logging.getLogger("tfservo.cli.tfs")

DEFAULT_REST_PORT = 8501


@dataclass(frozen=True)
class Flag:
    kind: type  # int, float, str or bool
    default: object
    acted_on: bool = True  # False: accepted, warned about, ignored


# TF Serving 2.x's flags (model_servers/main.cc) and their defaults: those that are tfservo
# settings come from the settings' declarations (tfservo.core.settings); these are TF Serving's own.
_TF_SERVING_ONLY: dict[str, Flag] = {
    "model_name": Flag(str, "default"),
    "model_base_path": Flag(str, ""),
    "tensorflow_session_parallelism": Flag(int, 0),
    "allow_version_labels_for_unavailable_models": Flag(bool, False),
    # accepted, not acted on
    "rest_api_num_threads": Flag(int, 0, False),
    "rest_api_enable_cors_support": Flag(bool, False, False),
    "num_load_threads": Flag(int, 0, False),
    "num_unload_threads": Flag(int, 0, False),
    "max_num_load_retries": Flag(int, 5, False),
    "load_retry_interval_micros": Flag(int, 60_000_000, False),
    "flush_filesystem_caches": Flag(bool, True, False),
    "tensorflow_session_config_file": Flag(str, "", False),
    "platform_config_file": Flag(str, "", False),
    "per_process_gpu_memory_fraction": Flag(float, 0.0, False),
    "saved_model_tags": Flag(str, "serve", False),
    "grpc_max_threads": Flag(int, 0, False),
    "num_request_iterations_for_warmup": Flag(int, 1, False),
    "remove_unused_fields_from_bundle_metagraph": Flag(bool, True, False),
    "num_tflite_pools": Flag(int, 1, False),
    "num_tflite_interpreters": Flag(int, 1, False),
    "xla_cpu_compilation_enabled": Flag(bool, False, False),
    "thread_pool_factory_config_file": Flag(str, "", False),
    "mixed_precision": Flag(str, "", False),
    "skip_initialize_tpu": Flag(bool, False, False),
    "use_alts_credentials": Flag(bool, False, False),
    "use_tflite_model": Flag(bool, False),  # TF Serving's older name of --prefer_tflite_model
    "enable_grpc_healthcheck_service": Flag(bool, True, False),  # tfservo always serves grpc.health.v1
}
_SETTING_OF_FLAG = {option.tfs.name: option for option in tfs_flags() if option.tfs is not None}
TF_SERVING_FLAGS: dict[str, Flag] = {
    **{name: Flag(type(option.tfs.default), option.tfs.default) for name, option in _SETTING_OF_FLAG.items()
       if option.tfs is not None},
    **_TF_SERVING_ONLY,
}

_TRUE, _FALSE = {"true", "1", "yes", "t", "y"}, {"false", "0", "no", "f", "n"}


def parse_tfs_args(argv: Sequence[str]) -> tuple[dict[str, object], list[str]]:
    """absl-style flags → ({name: value} of those given, names given but not acted on)."""
    given: dict[str, object] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("--help", "-h", "--helpfull"):
            raise SystemExit(_usage())
        if arg == "--version":
            from tfservo.core.version import __version__

            print(f"TensorFlow ModelServer: tfservo {__version__}")
            raise SystemExit(0)
        if not arg.startswith("-") or arg in ("-", "--"):
            raise ConfigError(f"unexpected argument {arg!r}: tensorflow_model_server takes only --flags")
        body = arg.lstrip("-")
        name, has_value, text = body.partition("=")
        flag = TF_SERVING_FLAGS.get(name)
        if flag is None and name.startswith("no") and TF_SERVING_FLAGS.get(name[2:], Flag(str, "")).kind is bool:
            name, flag, has_value, text = name[2:], TF_SERVING_FLAGS[name[2:]], "=", "false"
        if flag is None:
            close = difflib.get_close_matches(name, TF_SERVING_FLAGS, n=1)
            hint = f"; did you mean --{close[0]}?" if close else "; tensorflow_model_server --help lists them"
            raise ConfigError(f"unknown flag --{name}{hint}")
        if not has_value:
            if flag.kind is bool and (not args or args[0].startswith("-") or args[0].lower() not in _TRUE | _FALSE):
                text = "true"
            elif not args:
                raise ConfigError(f"flag --{name} needs a value")
            else:
                text = args.pop(0)
        given[name] = _convert(name, flag, text)
    ignored = [name for name in given if not TF_SERVING_FLAGS[name].acted_on]
    return given, ignored


def _convert(name: str, flag: Flag, text: str) -> object:
    if flag.kind is bool:
        low = text.lower()
        if low not in _TRUE | _FALSE:
            raise ConfigError(f"flag --{name} is true or false, got {text!r}")
        return low in _TRUE
    try:
        return flag.kind(text)
    except ValueError:
        raise ConfigError(f"flag --{name} needs {flag.kind.__name__} value, got {text!r}") from None


def settings_from_tfs_args(
    argv: Sequence[str], env: Mapping[str, str] | None = None, *, warn: Callable[[str], None] = log.warning
) -> Settings:
    """TF Serving's flags (and MODEL_NAME/MODEL_BASE_PATH) as tfservo's Settings."""
    real = env is None
    env = environment() if env is None else env
    argv, config = _config_file(argv)
    if config is not None:
        if real:
            export(dict(config.env))  # the file over the environment, for the workers too
        env = {**env, **config.env}
        # its TF Serving flags come first on the command line, so the flags given win over them
        argv = [*(f"--{name}={text}" for name, text in config.extra.items()), *argv]
    given, ignored = parse_tfs_args(argv)
    for name in ignored:
        warn(f"--{name} is accepted for compatibility and has no effect in tfservo")
    value = {name: given.get(name, flag.default) for name, flag in TF_SERVING_FLAGS.items()}
    model_name = given.get("model_name") or env.get("MODEL_NAME") or value["model_name"]
    base_path = value["model_base_path"]
    if not base_path and "model_base_path" not in given and env.get("MODEL_BASE_PATH") and not value["model_config_file"]:
        base_path = f"{env['MODEL_BASE_PATH'].rstrip('/')}/{model_name}"
    if not value["model_config_file"] and not base_path:
        raise ConfigError(
            "nothing to serve: give --model_base_path=/models/NAME (and --model_name), "
            "--model_config_file, or MODEL_NAME and MODEL_BASE_PATH"
        )
    if value["use_tflite_model"]:
        value["prefer_tflite_model"] = True
    if value["allow_version_labels_for_unavailable_models"]:
        warn("--allow_version_labels_for_unavailable_models: tfservo allows labels on any configured version")
    if value["tensorflow_session_parallelism"] and not value["tensorflow_intra_op_parallelism"]:
        value["tensorflow_intra_op_parallelism"] = value["tensorflow_session_parallelism"]
        value["tensorflow_inter_op_parallelism"] = value["tensorflow_session_parallelism"]
    flags: dict[str, Any] = {}
    for name, option in _SETTING_OF_FLAG.items():
        assert option.tfs is not None
        setting = option.tfs.convert(value[name]) if option.tfs.convert else value[name]
        # TF Serving's "unset" ("" or a 0 thread count) leaves the setting to tfservo's environment/default
        flags[option.name] = None if setting == "" or (setting == 0 and option.env) else setting
    if given.get("enable_batching") is False:
        flags["batching"] = "off"  # TF Serving's own default, said out loud: no batching
    flags["model_base_path"] = base_path or None
    flags["model_name"] = model_name
    for name, setting in (config.flags if config is not None else {}).items():
        if flags.get(name) is None:  # a tfservo setting by its serve flag's name, where no TF flag said it
            flags[name] = setting
    return resolve_settings(multi_model=False, serve_default_path=False, env=env, **flags)


def _config_file(argv: Sequence[str]) -> tuple[list[str], ConfigFile | None]:
    """argv without `--config=FILE` (tfservo's, as on serve), and the file it names."""
    rest, path = [], None
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("--config", "-config"):
            if not args:
                raise ConfigError("flag --config needs a file")
            path = args.pop(0)
        elif arg.startswith(("--config=", "-config=")):
            path = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return rest, (read_config_file(path, extra=TF_SERVING_FLAGS) if path else None)


def _usage() -> str:
    lines = ["usage: tensorflow_model_server [--flag=value]...", "", "Flags (TF Serving's; * accepted, no effect):"]
    for name, flag in TF_SERVING_FLAGS.items():
        lines.append(f"  --{name}={flag.default!r}{'' if flag.acted_on else '  *'}")
    lines += ["", "tfservo's own:", "  --config=FILE  settings from a TOML, YAML or JSON file: these flags' names, "
              "`tfservo serve`'s (without dashes) or their variables; the flags given here win over it"]
    return "\n".join(lines)


def run(argv: Sequence[str] | None = None) -> None:
    """The `tensorflow_model_server` console script."""
    quiet_tensorflow()
    setup_logging(log_level_from_env())
    try:
        settings = settings_from_tfs_args(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"tensorflow_model_server: {exc.message}", file=sys.stderr)
        raise SystemExit(2) from None
    setup_logging(settings.log_level, settings.log_format, settings.access_log)
    from tfservo.core.errors import ServingError
    from tfservo.server.run import serve

    try:
        serve(settings)
    except ServingError as exc:
        print(f"tensorflow_model_server: {exc.message}", file=sys.stderr)
        raise SystemExit(1) from None
    except OSError as exc:
        print(f"tensorflow_model_server: cannot listen on {settings.host}:{settings.port}: {exc.strerror}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    run()
