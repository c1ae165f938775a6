"""The manifests in deploy/ mean what their comments say: their command lines and environment
resolve to tfservo settings (keys from the mounted Secret, every interface, management behind
the keys), and every volume a container mounts is declared."""

from __future__ import annotations

from pathlib import Path

import yaml
from conftest import TFS

from tfservo.auth.keys import add_key
from tfservo.cli.commands import serve
from tfservo.cli.tfs import settings_from_tfs_args
from tfservo.core.settings import resolve_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KEYS_IN_POD = "/etc/tfservo/keys/keys.json"


def documents(name: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]


def mounts_are_declared(pod: dict) -> None:
    declared = {volume["name"] for volume in pod.get("volumes", [])}
    for container in pod["containers"]:
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in declared, f"{container['name']} mounts undeclared volume {mount['name']}"
    secrets = {volume["secret"]["secretName"] for volume in pod.get("volumes", []) if "secret" in volume}
    assert secrets == {"tfservo-api-keys"}


def test_the_kubernetes_deployment_serves_with_keys_from_its_secret(tmp_path):
    keys = str(tmp_path / "keys.json")
    add_key(keys, "frontend", ["invoke"])
    deployment = next(doc for doc in documents("kubernetes-deployment.yaml") if doc["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    mounts_are_declared(pod)
    container = pod["containers"][0]
    command, *args = container["args"]
    assert command == "serve"  # the image's entrypoint runs `tfservo serve --host 0.0.0.0 ARGS`
    env = {item["name"]: item["value"].replace(KEYS_IN_POD, keys) for item in container["env"]}
    assert container["volumeMounts"][1]["mountPath"] == str(Path(KEYS_IN_POD).parent)
    flags = serve.make_context("serve", ["--host", "0.0.0.0", *args]).params
    paths = flags.pop("paths") or (str(TFS / "saved_model_half_plus_two_cpu"),)
    assert flags.pop("config_file") is None  # serve's own input, not a setting: the manifest gives none
    settings = resolve_settings(paths=paths, env=env, **{k: None if v is False else v for k, v in flags.items()})
    assert (settings.api_keys, settings.host, settings.workers) == (keys, "0.0.0.0", 2)
    assert settings.management_open() == (True, "keys with scope manage (--api-keys)")


def test_the_kserve_runtime_passes_tf_servings_flags_and_the_keys_file(tmp_path):
    keys = str(tmp_path / "keys.json")
    add_key(keys, "kserve", ["invoke"])
    runtime = documents("kserve-servingruntime.yaml")[0]
    mounts_are_declared(runtime["spec"])
    container = runtime["spec"]["containers"][0]
    assert container["command"] == ["tfservo-entrypoint", "tensorflow_model_server"]
    args = [arg.replace("{{.Name}}", "half_plus_two").replace(KEYS_IN_POD, keys) for arg in container["args"]]
    settings = settings_from_tfs_args(args, env={})
    assert (settings.api_keys, settings.port, settings.grpc_port, settings.host) == (keys, 8080, 9000, "0.0.0.0")
    assert settings.management_open()[0] is True
