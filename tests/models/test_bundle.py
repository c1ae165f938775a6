"""Bundle discovery on the real SageMaker / TF Serving test data, local archives and a real S3 server."""

from __future__ import annotations

import io
import logging
import os
import shutil
import tarfile
from pathlib import Path

import pytest
from s3_server import upload_dir, upload_file

from tfservo.core.errors import BundleError
from tfservo.models.bundle import ModelSource, discover_versions, is_model_name, open_bundle


@pytest.fixture
def smc(testdata: Path) -> Path:
    return testdata / "sagemaker-tfs-container" / "resources"


@pytest.fixture
def hp3(smc: Path) -> Path:
    return smc / "models" / "half_plus_three"


def make_tar(path: Path, members: dict[str, Path | bytes], mode: str = "w:gz") -> Path:
    """Write a tarball whose members are `arcname → local file/dir or file bytes`."""
    with tarfile.open(path, mode) as tar:
        for arcname, src in members.items():
            if isinstance(src, bytes):
                info = tarfile.TarInfo(arcname)
                info.size = len(src)
                tar.addfile(info, io.BytesIO(src))
            else:
                tar.add(src, arcname=arcname)
    return path


INFERENCE_PY = b"def input_handler(data, context):\n    return data\n"


# ------------------------------------------------------------------------- local directories


def test_model_dir_skips_hidden_version(hp3: Path) -> None:
    b = open_bundle(str(hp3))
    assert list(b.models) == ["half_plus_three"]
    m = b.models["half_plus_three"]
    assert m.versions == {123: str(hp3 / "00000123"), 124: str(hp3 / "00000124")}
    assert m.latest_version == 124
    assert m.base_path == str(hp3)
    assert m.code_dir is None and b.code_dir is None
    assert b.root == str(hp3) and b.source == str(hp3)


def test_tf_serving_two_versions(testdata: Path) -> None:
    d = testdata / "tf-serving" / "saved_model_half_plus_two_2_versions"
    b = open_bundle(str(d) + "/")
    assert list(b.models) == ["saved_model_half_plus_two_2_versions"]
    assert list(b.models["saved_model_half_plus_two_2_versions"].versions) == [123, 124]


def test_multi_model_dir_skips_dirs_without_versions(smc: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tfservo.models.bundle"):
        b = open_bundle(str(smc / "mme"))
    assert list(b.models) == ["half_plus_three", "half_plus_two"]
    assert list(b.models["half_plus_three"].versions) == [123, 124]
    assert list(b.models["half_plus_two"].versions) == [123]
    assert "invalid_version" in caplog.text


def test_multi_model_dir_is_sorted_and_has_universal_code(tmp_path: Path, hp3: Path) -> None:
    for name in ("zeta", "alpha", "mid"):
        shutil.copytree(hp3 / "00000123", tmp_path / name / "1")
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "inference.py").write_bytes(INFERENCE_PY)
    (tmp_path / ".ipynb_checkpoints" / "1").mkdir(parents=True)
    b = open_bundle(str(tmp_path))
    assert list(b.models) == ["alpha", "mid", "zeta"]
    assert b.code_dir == str(tmp_path / "code")
    assert all(m.code_dir is None for m in b.models.values())


def test_bare_saved_model_dir(tmp_path: Path, hp3: Path) -> None:
    d = shutil.copytree(hp3 / "00000123", tmp_path / "my_model")
    b = open_bundle(str(d))
    assert b.models == {"my_model": ModelSource("my_model", str(d), {1: str(d)}, None)}
    assert discover_versions(str(d)) == {1: str(d)}


def test_file_url(hp3: Path) -> None:
    b = open_bundle(hp3.as_uri())
    assert list(b.models) == ["half_plus_three"] and b.source == hp3.as_uri()


def test_wrapper_dirs_are_descended(tmp_path: Path, hp3: Path) -> None:
    shutil.copytree(hp3 / "00000123", tmp_path / "export" / "Servo" / "1")
    b = open_bundle(str(tmp_path))
    assert list(b.models) == ["Servo"]


# ------------------------------------------------------------------------- discover_versions


def test_discover_versions_rules(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for name in ("00000123", "7", ".00000111", "abc", "12a", "0007"):
        (tmp_path / name).mkdir()
    (tmp_path / "99").write_text("a file, not a version dir")
    with caplog.at_level(logging.WARNING, logger="tfservo.models.bundle"):
        versions = discover_versions(str(tmp_path))
    assert versions == {7: str(tmp_path / "0007"), 123: str(tmp_path / "00000123")}
    assert "version 7" in caplog.text
    assert discover_versions(str(tmp_path / "missing")) == {}


@pytest.mark.parametrize(
    ("name", "ok"),
    [("half_plus_three", True), ("m-1.2", True), ("0", True), ("A", True),
     ("", False), (".hidden", False), ("-x", False), ("a b", False), ("a/b", False), ("é", False)],
)
def test_is_model_name(name: str, ok: bool) -> None:
    assert is_model_name(name) is ok


# ------------------------------------------------------------------------- archives


@pytest.mark.parametrize(("suffix", "mode"), [(".tar.gz", "w:gz"), (".tgz", "w:gz"), (".tar", "w")])
def test_sagemaker_archive_versions_at_root(tmp_path: Path, hp3: Path, suffix: str, mode: str) -> None:
    tar = make_tar(tmp_path / f"model{suffix}", {
        "00000123": hp3 / "00000123", "00000124": hp3 / "00000124", "code/inference.py": INFERENCE_PY,
    }, mode)
    b = open_bundle(str(tar), cache_dir=str(tmp_path / "cache"))
    assert list(b.models) == ["model"]
    m = b.models["model"]
    assert list(m.versions) == [123, 124]
    assert Path(m.versions[124], "saved_model.pb").is_file()
    assert b.code_dir == os.path.join(b.root, "code") and m.code_dir == b.code_dir
    assert Path(b.code_dir, "inference.py").read_bytes() == INFERENCE_PY
    assert b.root.startswith(str(tmp_path / "cache")) and b.source == str(tar)


def test_multi_model_archive_code_at_root(tmp_path: Path, smc: Path) -> None:
    tar = make_tar(tmp_path / "model.tar.gz", {
        "half_plus_two": smc / "mme" / "half_plus_two", "half_plus_three": smc / "mme" / "half_plus_three",
        "code/inference.py": INFERENCE_PY,
    })
    b = open_bundle(str(tar), cache_dir=str(tmp_path / "cache"))
    assert list(b.models) == ["half_plus_three", "half_plus_two"]
    assert b.code_dir == os.path.join(b.root, "code")
    assert b.models["half_plus_two"].code_dir is None


def test_multi_model_archive_code_inside_model(tmp_path: Path, smc: Path) -> None:
    tar = make_tar(tmp_path / "model.tar.gz", {
        "half_plus_two": smc / "mme" / "half_plus_two", "half_plus_three": smc / "mme" / "half_plus_three",
        "half_plus_two/code/inference.py": INFERENCE_PY,
    })
    b = open_bundle(str(tar), cache_dir=str(tmp_path / "cache"))
    assert b.code_dir is None
    assert b.models["half_plus_two"].code_dir == os.path.join(b.root, "half_plus_two", "code")
    assert b.models["half_plus_three"].code_dir is None


def test_single_model_dir_archive_keeps_its_name(tmp_path: Path, hp3: Path) -> None:
    tar = make_tar(tmp_path / "m.tgz", {"half_plus_three": hp3})
    b = open_bundle(str(tar), cache_dir=str(tmp_path / "cache"))
    assert list(b.models) == ["half_plus_three"]
    assert list(b.models["half_plus_three"].versions) == [123, 124]  # .00000111 still skipped


def test_bare_saved_model_archive(tmp_path: Path, hp3: Path) -> None:
    tar = make_tar(tmp_path / "model.tar.gz", {".": hp3 / "00000123"})
    b = open_bundle(str(tar), cache_dir=str(tmp_path / "cache"))
    assert list(b.models) == ["model"] and list(b.models["model"].versions) == [1]


def test_archive_extraction_is_reused(tmp_path: Path, hp3: Path) -> None:
    tar = make_tar(tmp_path / "model.tar.gz", {"00000123": hp3 / "00000123"})
    first = open_bundle(str(tar), cache_dir=str(tmp_path / "cache"))
    marker = Path(first.root, "extra.txt")
    marker.write_text("kept")
    assert open_bundle(str(tar), cache_dir=str(tmp_path / "cache")).root == first.root
    assert marker.exists()


def test_archive_without_cache_dir_uses_temp_dir(tmp_path: Path, hp3: Path) -> None:
    tar = make_tar(tmp_path / "model.tar.gz", {"00000123": hp3 / "00000123"})
    b = open_bundle(str(tar))
    assert not b.root.startswith(str(tmp_path)) and os.path.isdir(b.root)
    assert list(b.models) == ["model"]


def test_archive_with_parent_member_is_refused(tmp_path: Path, hp3: Path) -> None:
    tar = make_tar(tmp_path / "evil.tar.gz", {
        "00000123": hp3 / "00000123", "../escaped.txt": b"pwned",
    })
    with pytest.raises(BundleError, match=r"refusing to extract .*evil\.tar\.gz") as e:
        open_bundle(str(tar), cache_dir=str(tmp_path / "cache"))
    assert "escaped.txt" in str(e.value)
    assert not list(tmp_path.rglob("escaped.txt"))


def test_archive_with_escaping_symlink_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.tar"
    with tarfile.open(path, "w") as tar:
        link = tarfile.TarInfo("00000123")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc"
        tar.addfile(link)
    with pytest.raises(BundleError, match="refusing to extract"):
        open_bundle(str(path), cache_dir=str(tmp_path / "cache"))


def test_truncated_archive(tmp_path: Path, hp3: Path) -> None:
    tar = make_tar(tmp_path / "model.tar.gz", {"00000123": hp3 / "00000123"})
    data = tar.read_bytes()
    tar.write_bytes(data[: len(data) // 2])
    with pytest.raises(BundleError, match=r"could not extract .*model\.tar\.gz"):
        open_bundle(str(tar), cache_dir=str(tmp_path / "cache"))


# ------------------------------------------------------------------------- errors and defaults


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"nope.*does not exist"):
        open_bundle(str(tmp_path / "nope"))


def test_empty_dir_says_what_layout_is_expected(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"no models found in .*expected one of"):
        open_bundle(str(tmp_path))


def test_dir_without_models(smc: Path) -> None:
    with pytest.raises(BundleError, match="invalid_version"):
        open_bundle(str(smc / "mme" / "invalid_version"))


def test_plain_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "model.json"
    f.write_text("{}")
    with pytest.raises(BundleError, match=r"model\.json is a file but not a tar archive"):
        open_bundle(str(f))


def test_invalid_model_dir_name(tmp_path: Path, hp3: Path) -> None:
    shutil.copytree(hp3 / "00000123", tmp_path / "bad name" / "1")
    with pytest.raises(BundleError, match="rename the directory"):
        open_bundle(str(tmp_path / "bad name"))


def _default_model(path: Path, env: dict[str, str]) -> str | None:
    """The default model the one settings resolution and service factory choose."""
    from tfservo.core.settings import resolve_settings
    from tfservo.service.factory import build_service

    service = build_service(resolve_settings(paths=[str(path)], multi_model=False, env=env))
    try:
        return service.default_model()
    finally:
        service.close()


def test_default_model_name_from_env(smc: Path) -> None:
    assert _default_model(smc / "mme", {}) == "half_plus_three"  # the first model by name
    assert _default_model(smc / "mme", {"SAGEMAKER_TFS_DEFAULT_MODEL_NAME": "half_plus_two"}) == "half_plus_two"
    assert _default_model(smc / "mme", {"SAGEMAKER_TFS_DEFAULT_MODEL_NAME": "None"}) == "half_plus_three"
    with pytest.raises(BundleError, match="half_plus_three, half_plus_two"):
        _default_model(smc / "mme", {"SAGEMAKER_TFS_DEFAULT_MODEL_NAME": "missing"})


def test_default_model_name_reads_os_environ(smc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setenv("SAGEMAKER_TFS_DEFAULT_MODEL_NAME", "half_plus_two")
    assert _default_model(smc / "mme", dict(os.environ)) == "half_plus_two"
    monkeypatch.delenv("SAGEMAKER_TFS_DEFAULT_MODEL_NAME")
    assert _default_model(smc / "mme", dict(os.environ)) == "half_plus_three"


# ------------------------------------------------------------------------- S3 (moto server + s3fs)


def test_s3_archive(tmp_path: Path, hp3: Path, s3_endpoint: str, s3_bucket: str) -> None:
    tar = make_tar(tmp_path / "model.tar.gz", {
        "00000123": hp3 / "00000123", "code/inference.py": INFERENCE_PY,
    })
    url = upload_file(s3_endpoint, s3_bucket, "jobs/output/model.tar.gz", tar)
    b = open_bundle(url, cache_dir=str(tmp_path / "cache"))
    assert b.source == url and list(b.models) == ["model"]
    assert list(b.models["model"].versions) == [123]
    assert Path(b.code_dir or "", "inference.py").read_bytes() == INFERENCE_PY
    assert open_bundle(url, cache_dir=str(tmp_path / "cache")).root == b.root  # cached


def test_s3_prefixes(tmp_path: Path, smc: Path, hp3: Path, s3_endpoint: str, s3_bucket: str) -> None:
    upload_dir(s3_endpoint, s3_bucket, "models/mme", smc / "mme")
    upload_dir(s3_endpoint, s3_bucket, "models/mme-other/x", hp3)  # shares the prefix string
    upload_dir(s3_endpoint, s3_bucket, "models/half_plus_three", hp3)

    b = open_bundle(f"s3://{s3_bucket}/models/mme/", cache_dir=str(tmp_path / "cache"))
    assert list(b.models) == ["half_plus_three", "half_plus_two"]
    assert Path(b.models["half_plus_two"].versions[123], "variables", "variables.index").is_file()

    single = open_bundle(f"s3://{s3_bucket}/models/half_plus_three", cache_dir=str(tmp_path / "cache"))
    assert list(single.models) == ["half_plus_three"]
    assert list(single.models["half_plus_three"].versions) == [123, 124]


def test_s3_missing(tmp_path: Path, s3_bucket: str) -> None:
    with pytest.raises(BundleError, match=rf"s3://{s3_bucket}/nothing/here.*does not exist"):
        open_bundle(f"s3://{s3_bucket}/nothing/here/", cache_dir=str(tmp_path / "cache"))


@pytest.mark.parametrize("var", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_s3_endpoint_from_either_env_var(
    tmp_path: Path, hp3: Path, s3_endpoint: str, s3_bucket: str, var: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import s3fs

    url = upload_dir(s3_endpoint, s3_bucket, "hp3", hp3)
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name)
    monkeypatch.setenv(var, s3_endpoint)
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        assert list(open_bundle(url, cache_dir=str(tmp_path)).models) == ["hp3"]
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
