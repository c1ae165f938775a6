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


def test_batching_is_adaptive_unless_a_sagemaker_or_tf_serving_setting_says_otherwise():
    def mode(env=None, tfs=None, **flags):
        if tfs is not None:
            settings = settings_from_tfs_args(["--model_name=m", "--model_base_path=/models/m", *tfs], env=env or {})
        else:
            settings = resolve_settings(paths=["m"], env=env or {}, **flags)
        return settings.batching.mode if settings.batching else "off"

    assert mode() == "auto" and mode(tfs=[]) == "auto"
    assert resolve_settings(paths=["m"], env={}).batching.max_batch_size == 32
    assert mode({"SAGEMAKER_TFS_ENABLE_BATCHING": "false"}) == "off"
    assert mode({"SAGEMAKER_TFS_ENABLE_BATCHING": "true"}) == "timeout"
    assert mode(enable_batching=True) == "timeout" and mode(tfs=["--enable_batching"]) == "timeout"
    assert mode(tfs=["--enable_batching=false"]) == "off" and mode(tfs=["--noenable_batching"]) == "off"
    assert mode({"TFSERVO_BATCHING": "off"}) == "off" and mode(batching="eager") == "eager"
    assert mode({"TFSERVO_BATCHING_EAGER": "1"}) == "eager"
    assert mode({"TFSERVO_BATCHING": "off"}, batching="auto") == "auto"  # the flag wins
    assert resolve_settings(paths=["m"], env={}, serving=False).batching is None
    with pytest.raises(ConfigError, match="environment variable TFSERVO_BATCHING is one of auto, timeout, eager, off"):
        mode({"TFSERVO_BATCHING": "sometimes"})


def test_workers_default_to_one_per_core_for_small_models_and_two_for_large_that_memory_allows(tmp_path, monkeypatch):
    from tfservo.core import settings as settings_module

    monkeypatch.setattr(settings_module, "usable_cores", lambda: 16)
    monkeypatch.setattr(settings_module, "memory_limit_bytes", lambda: 32 * 2**30)
    small = tmp_path / "small"
    small.mkdir()
    (small / "weights").write_bytes(b"x" * 1000)
    assert resolve_settings(paths=[str(small)], env={}).workers == 16  # a small model: one per core
    medium = tmp_path / "medium.tar.gz"
    with open(medium, "wb") as f:
        f.truncate(settings_module.SMALL_MODELS_BYTES + 1)
    assert resolve_settings(paths=[str(medium)], env={}).workers == 8  # larger: one per two cores
    big = tmp_path / "big.tar.gz"
    with open(big, "wb") as f:
        f.truncate(3 * 2**30)  # sparse: a 3 GB bundle, 7 GB a worker
    assert resolve_settings(paths=[str(big)], env={}).workers == 3  # memory: 25.6 GB // 7 GB
    assert resolve_settings(paths=["s3://bucket/model.tar.gz"], env={}).workers == 6  # remote: 4 GB each
    assert resolve_settings(paths=[str(small)], env={"SAGEMAKER_GUNICORN_WORKERS": "3"}).workers == 3
    assert resolve_settings(paths=[str(small)], env={}, workers=1).workers == 1
    assert resolve_settings(multi_model=True, env={}).workers == 1
    assert resolve_settings(paths=[str(small)], env={}, no_supervisor=True).workers == 1  # one process
    assert resolve_settings(paths=[str(small)], env={}, serving=False).workers == 1  # invoke, transform
    monkeypatch.setattr(settings_module, "usable_cores", lambda: 1)
    assert resolve_settings(paths=[str(small)], env={}).workers == 1


def test_a_serving_workers_tensorflow_threads_are_its_share_of_the_cores(tmp_path, monkeypatch):
    from tfservo.core import settings as settings_module

    monkeypatch.setattr(settings_module, "usable_cores", lambda: 8)
    small = tmp_path / "small"
    small.mkdir()

    def threads(env: dict[str, str] | None = None, **flags: object) -> tuple[int, int]:
        s = resolve_settings(paths=[str(small)], env=env or {}, **flags)
        return s.workers, s.intra_op_threads

    assert threads() == (8, 1)  # a small model: a worker a core, one thread each
    assert threads(workers=2) == (2, 4) and threads(workers=3) == (3, 2)
    assert threads(workers=16) == (16, 1)  # never none
    assert threads(no_supervisor=True) == (1, 8)
    multi = resolve_settings(multi_model=True, env={})
    assert (multi.workers, multi.intra_op_threads) == (1, 8)
    assert threads({"SAGEMAKER_TFS_INTRA_OP_PARALLELISM": "3"}) == (8, 3)  # what the user sets wins
    assert threads(intra_op_threads=5) == (8, 5)
    tfs = settings_from_tfs_args(["--model_name=m", f"--model_base_path={small}", "--tensorflow_intra_op_parallelism=3"], env={})
    assert (tfs.workers, tfs.intra_op_threads) == (8, 3)
    assert threads({"SAGEMAKER_TFS_INTRA_OP_PARALLELISM": "0"}) == (8, 1)  # 0 is the container's "unset"
    assert threads(serving=False) == (1, 0)  # in-process: TensorFlow's choice


def test_every_declared_setting_belongs_to_exactly_one_group() -> None:
    from collections import Counter

    from tfservo.core.settings import GROUPS, grouped_options, options

    listed = Counter(name for group in GROUPS for name in group.names)
    assert [name for name, n in listed.items() if n > 1] == []
    assert {option.name for option in options()} == set(listed)
    assert all(option.group for option in options())
    assert sum(len(members) for _, members in grouped_options()) == len(options())
