"""Settings are declared once (tfservo.core.settings): the flags of both command lines and the
environment reading come from the declarations."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tfservo.cli.commands import main
from tfservo.cli.tfs import TF_SERVING_FLAGS, settings_from_tfs_args
from tfservo.core.settings import ConfigError, Settings, options, resolve_settings


def test_flag_over_environment_over_default():
    env = {"SAGEMAKER_BIND_TO_PORT": "9090", "SAGEMAKER_GUNICORN_TIMEOUT_SECONDS": "7"}
    assert resolve_settings(paths=["m"], env={}).port == 8080
    assert resolve_settings(paths=["m"], env=env).port == 9090
    assert resolve_settings(paths=["m"], env=env, port=1).port == 1
    assert resolve_settings(paths=["m"], env=env).invocation_timeout == 7.0
    assert resolve_settings(paths=["m"], env=env).host == "0.0.0.0"  # inside SageMaker


def test_bad_values_name_their_flag_or_variable():
    with pytest.raises(ConfigError, match="--workers must be at least 1, got 0"):
        resolve_settings(paths=["m"], env={}, workers=0)
    with pytest.raises(ConfigError, match="environment variable SAGEMAKER_GUNICORN_WORKERS must be at least 1"):
        resolve_settings(paths=["m"], env={"SAGEMAKER_GUNICORN_WORKERS": "0"})
    with pytest.raises(ConfigError, match="SAGEMAKER_BIND_TO_PORT='x' must be an integer"):
        resolve_settings(paths=["m"], env={"SAGEMAKER_BIND_TO_PORT": "x"})
    with pytest.raises(TypeError, match="unknown settings bogus"):
        resolve_settings(paths=["m"], env={}, bogus=1)


def test_every_declared_flag_is_an_option_of_serve():
    text = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200).output
    declared = [option for option in options() if option.flags]
    assert len(declared) >= 30
    for option in declared:
        assert option.flags[0] in text, option.name


def test_every_declared_tf_serving_flag_reaches_its_setting():
    fields = {f for f in Settings.__dataclass_fields__}
    tfs = [option for option in options() if option.tfs is not None]
    for option in tfs:
        assert option.tfs.name in TF_SERVING_FLAGS
        assert option.name in fields or option.name in ("enable_batching", "batching_parameters_file")
    settings = settings_from_tfs_args(
        ["--model_name=m", "--model_base_path=/models/m", "--port=7000", "--rest_api_port=7001",
         "--rest_api_timeout_in_ms=2500", "--file_system_poll_wait_seconds=3", "--noenable_model_warmup"],
        env={},
    )
    assert (settings.grpc_port, settings.port, settings.request_timeout) == (7000, 7001, 2.5)
    assert settings.file_system_poll_wait_seconds == 3.0 and settings.warmup is False


@pytest.mark.parametrize("flag", [{"max_requests": 100}, {"max_worker_memory_mb": 4096.0}])
def test_multi_model_mode_refuses_recycling_its_one_worker(flag) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_settings(multi_model=True, env={}, **flag)
    assert "cannot recycle its worker" in str(caught.value) and "TFSERVO_MME_MEMORY_MB" in str(caught.value)
    from tfservo.server.recycling import worker_memory_limit

    assert worker_memory_limit(resolve_settings(multi_model=True, env={})) == 0  # no default guard there either
    assert worker_memory_limit(resolve_settings(paths=["m"], env={})) > 0


def test_no_supervisor_refuses_what_needs_one() -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_settings(paths=["m"], no_supervisor=True, max_requests=10, env={})
    assert "--max-requests need(s) the supervisor" in str(caught.value)
