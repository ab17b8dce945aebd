"""The Kubernetes manifests agree with the image and the code (read, not assumed).

The image's metadata is parsed from the Containerfile (USER, EXPOSE, HEALTHCHECK, ENV,
VOLUME, WORKDIR); ports come from the server files and control files the pods run;
environment variable names from what the code reads (the twistd plugins, the server
config's ``MORTRED_<KEY>`` overrides, the entry point and the health check script);
the KEDA figures from the exporter's autoscale keys; the compose file of the Redis
profile names the same variables. That the probe paths are real routes, and that the
exporter serves the metric KEDA queries, is checked on the real processes
(test_live.py).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from mortred_twisted.config.secret_files import SECRET_VARIABLES, SUFFIX
from mortred_twisted.config.server import _ENV_ALIASES, SERVER_KEYS
from tests.deploy.manifests import (
    IN_CI,
    KUBE,
    ROOT,
    containerfile,
    containers,
    env_of,
    find,
    mortred_workloads,
    mounts,
    pod_spec,
    port_number,
    role,
    secret_file_paths,
    workloads,
)

ENTRYPOINT = ROOT / "deploy" / "container" / "entrypoint.sh"
HEALTHCHECK = ROOT / "deploy" / "container" / "healthcheck.py"
COMPOSE_REDIS = ROOT / "docker-compose.redis.yml"


def _names(path: Path, pattern: str) -> set[str]:
    return set(re.findall(pattern, path.read_text(encoding="utf-8")))


def names_read_by(role_name: str) -> set[str]:
    """Environment variable names the process of an entry-point mode reads."""
    entry = _names(ENTRYPOINT, r"\$\{(MORTRED_[A-Z_]+)")
    health = _names(HEALTHCHECK, r'environ\.get\("([A-Z_]+)"\)')
    server_keys = {f"MORTRED_{key.upper()}" for key in SERVER_KEYS} | set(_ENV_ALIASES)
    tap = ROOT / "mortred_twisted" / "tap"
    read = r'(?:env\.get|token)\("([A-Z_]+)"'
    by_role = {
        "model": server_keys,
        "gateway": _names(tap / "gateway.py", read),
        # its scalers read each id's server file with the environment (supervisor/meter.py)
        "supervisor": _names(tap / "supervisor.py", read) | server_keys,
    }
    return by_role[role_name] | entry | health


def plain_name(name: str) -> str:
    """``<NAME>_FILE`` -> ``<NAME>`` for a secret the code reads from a file."""
    base = name.removesuffix(SUFFIX)
    return base if name.endswith(SUFFIX) and base in SECRET_VARIABLES else name


def config_of(workload: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    """The control file (TOML) a gateway/supervisor pod runs, read from the ConfigMap's
    source in deploy/kubernetes/config/, and its path inside the image."""
    (container,) = containers(workload)
    image_path = Path("/opt/mortred") / env_of(container)["MORTRED_CONFIG"]
    for mount_path, volume in mounts(workload).items():
        if "configMap" in volume and image_path.parent == Path(mount_path):
            (item,) = [i for i in volume["configMap"]["items"] if i["path"] == image_path.name]
            source = KUBE / "config" / item["key"]
            return tomllib.loads(source.read_text(encoding="utf-8")), image_path
    raise AssertionError(f"MORTRED_CONFIG {image_path} is not a mounted ConfigMap file")


def model_args(workload: dict[str, Any]) -> dict[str, str]:
    (container,) = containers(workload)
    args = container["args"]
    assert args[0] == "model"
    return dict(zip(args[1::2], args[2::2], strict=True))


def by_role(name: str) -> list[dict[str, Any]]:
    return [w for w in mortred_workloads() if role(w) == name]


def test_every_role_is_deployed() -> None:
    assert sorted({role(w) for w in mortred_workloads()}) == ["gateway", "model", "supervisor"]
    assert [w["kind"] for w in workloads() if w not in mortred_workloads()] == ["StatefulSet"]


def test_user_and_security_context_are_the_images() -> None:
    image = containerfile()
    assert image.user == "10001"
    for workload in workloads():
        pod = pod_spec(workload)["securityContext"]
        assert pod["runAsNonRoot"] is True
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod_spec(workload)["automountServiceAccountToken"] is False
        for container in containers(workload):
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False
            assert ctx["readOnlyRootFilesystem"] is True
            assert ctx["capabilities"] == {"drop": ["ALL"]}
            assert container["resources"]["requests"]["cpu"]
            assert container["resources"]["requests"]["memory"]
    for workload in mortred_workloads():
        pod = pod_spec(workload)["securityContext"]
        assert str(pod["runAsUser"]) == image.user
        assert pod["runAsGroup"] == pod["fsGroup"] == 10001


def test_the_image_writes_only_where_volumes_are_mounted() -> None:
    """The image's VOLUME and /tmp (its caches' ENV point there) are writable volumes in
    every pod of the image; the manifests do not move the caches elsewhere."""
    image = containerfile()
    assert image.volumes == ["/var/lib/mortred"]
    cache_dirs = {k: v for k, v in image.env.items() if v.startswith("/tmp")}
    assert {"HOME", "HF_HOME", "TORCH_HOME", "MPLCONFIGDIR", "XDG_CACHE_HOME"} <= set(cache_dirs)
    for workload in mortred_workloads():
        mounted = mounts(workload)
        for path in [*image.volumes, "/tmp"]:
            assert "emptyDir" in mounted[path] or "persistentVolumeClaim" in mounted[path]
        (container,) = containers(workload)
        assert not set(env_of(container)) & set(cache_dirs), "caches moved off /tmp"


def test_config_maps_mount_under_the_images_conf() -> None:
    """Relative paths in a control file resolve against the parent of the nearest
    conf/ (config/server.find_root): mounted under WORKDIR/conf they mean the image's
    /opt/mortred, where the Containerfile copies conf/."""
    image = containerfile()
    for workload in by_role("gateway") + by_role("supervisor"):
        config, image_path = config_of(workload)
        assert image_path.is_relative_to(Path(image.workdir) / "conf")
        catalog = ROOT / config["supervisor"]["catalog_dir"]
        assert catalog.is_dir(), catalog


def test_ports_are_the_images_and_the_configs() -> None:
    image = containerfile()
    (gateway,) = by_role("gateway")
    (exporter,) = by_role("supervisor")
    gw_config, _ = config_of(gateway)
    sup_config, _ = config_of(exporter)
    (gw,) = containers(gateway)
    (sup,) = containers(exporter)
    assert [p["containerPort"] for p in gw["ports"]] == [gw_config["gateway"]["port"]]
    assert [p["containerPort"] for p in sup["ports"]] == [sup_config["supervisor"]["api_port"]]
    assert sorted(image.expose) == sorted(
        [gw_config["gateway"]["port"], sup_config["supervisor"]["api_port"]]
    )
    assert gw_config["gateway"]["host"] == sup_config["supervisor"]["api_host"] == "0.0.0.0"
    for workload in by_role("model"):
        (container,) = containers(workload)
        server = tomllib.loads((ROOT / model_args(workload)["--config"]).read_text())["server"]
        port = int(env_of(container)["MORTRED_LISTEN_PORT"])
        assert port == server["port"]
        assert [p["containerPort"] for p in container["ports"]] == [port]


def test_services_reach_the_pods_ports() -> None:
    for workload in workloads():
        name = workload["metadata"]["name"]
        service = find("Service", name)
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
        (container,) = containers(workload)
        for port in service["spec"]["ports"]:
            port_number(container, port["targetPort"])  # a named port of the container


def test_the_gateway_routes_each_model_to_its_service() -> None:
    (gateway,) = by_role("gateway")
    config, _ = config_of(gateway)
    upstreams = config["gateway"]["upstreams"]
    models = by_role("model")
    assert sorted(upstreams) == sorted(
        w["metadata"]["labels"]["mortred.io/model-id"] for w in models
    )
    for workload in models:
        model_id = workload["metadata"]["labels"]["mortred.io/model-id"]
        server = tomllib.loads((ROOT / model_args(workload)["--config"]).read_text())["server"]
        assert server["id"] == model_id and server["job_store"] == "redis"
        service = find("Service", workload["metadata"]["name"])
        (url,) = upstreams[model_id]
        parts = urlsplit(url)
        assert parts.hostname == service["metadata"]["name"]
        assert parts.port == service["spec"]["ports"][0]["port"]


def test_probes_use_the_containers_ports_and_the_health_check_agrees() -> None:
    image = containerfile()
    assert "mortred-healthcheck" in image.healthcheck
    assert "MORTRED_HEALTH_URL" in HEALTHCHECK.read_text()
    (gateway,) = by_role("gateway")
    (gw,) = containers(gateway)
    gw_probe = gw["readinessProbe"]["httpGet"]
    default = f"http://127.0.0.1:{port_number(gw, gw_probe['port'])}{gw_probe['path']}"
    assert image.env["MORTRED_HEALTH_URL"] == default
    for workload in mortred_workloads():
        (container,) = containers(workload)
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            if kind in container:
                probe = container[kind]["httpGet"]
                assert port_number(container, probe["port"]) in [
                    p["containerPort"] for p in container["ports"]
                ]
                assert probe["path"].startswith("/")
    for workload in by_role("model"):
        (container,) = containers(workload)
        probe = container["readinessProbe"]["httpGet"]
        own = f"http://127.0.0.1:{port_number(container, probe['port'])}{probe['path']}"
        assert env_of(container)["MORTRED_HEALTH_URL"] == own


def test_environment_names_are_what_the_code_reads() -> None:
    for workload in mortred_workloads():
        (container,) = containers(workload)
        env = env_of(container)
        assert not [e for e in container.get("env", []) if "valueFrom" in e]
        read = names_read_by(role(workload))
        for name in env:
            assert plain_name(name) in read, (workload["metadata"]["name"], name)


def test_secrets_are_files_from_the_secret() -> None:
    """Every secret the pod needs comes as ``<NAME>_FILE`` naming a file of a mounted
    Secret; no token value or secret variable is in a manifest."""
    for workload in mortred_workloads():
        (container,) = containers(workload)
        env = env_of(container)
        files = secret_file_paths(workload)
        assert not set(env) & set(SECRET_VARIABLES), "a secret as a literal value"
        for name, value in env.items():
            if name.endswith(SUFFIX):
                assert plain_name(name) in SECRET_VARIABLES
                assert value in files, (name, value)
        assert sorted(files) == sorted(v for k, v in env.items() if k.endswith(SUFFIX)), (
            "a Secret key mounted that no variable reads"
        )
        for volume in mounts(workload).values():
            if "secret" in volume:
                assert volume["secret"]["defaultMode"] == 0o440


def test_models_drain_within_the_pods_grace() -> None:
    for workload in by_role("model"):
        grace = float(model_args(workload)["--grace"])
        assert pod_spec(workload)["terminationGracePeriodSeconds"] > grace
        strategy = workload["spec"]["strategy"]["rollingUpdate"]
        assert strategy["maxUnavailable"] == 0


def test_exporter_logs_go_to_the_data_volume() -> None:
    image = containerfile()
    (exporter,) = by_role("supervisor")
    config, _ = config_of(exporter)
    assert Path(config["supervisor"]["log_dir"]).is_relative_to(image.volumes[0])
    assert containers(exporter)[0]["args"] == ["supervisor", "--no-gateway"]


def test_keda_scales_each_model_as_the_exporter_would() -> None:
    """The ScaledObject carries the exporter's autoscale keys of the id (same
    semantics as the supervisor's own scaler) and queries its backlog gauge."""
    (exporter,) = by_role("supervisor")
    config, _ = config_of(exporter)
    scaled = [d for w in by_role("model") for d in [find("ScaledObject", w["metadata"]["name"])]]
    for workload, obj in zip(by_role("model"), scaled, strict=True):
        model_id = workload["metadata"]["labels"]["mortred.io/model-id"]
        keys = config["servers"][model_id]
        spec = obj["spec"]
        assert spec["scaleTargetRef"]["name"] == workload["metadata"]["name"]
        assert spec["maxReplicaCount"] == keys["max_replicas"]
        assert spec["minReplicaCount"] == max(1, keys["min_replicas"])
        behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert behavior["scaleUp"]["stabilizationWindowSeconds"] == keys["scale_up_window_s"]
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] == keys["scale_down_window_s"]
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "prometheus"
        assert float(trigger["metadata"]["threshold"]) == keys["target_backlog_per_replica"]
        assert (
            trigger["metadata"]["query"] == f'max(mortred_autoscale_backlog{{model="{model_id}"}})'
        )


def compose_redis() -> dict[str, Any]:
    if not COMPOSE_REDIS.exists():
        if IN_CI:
            pytest.fail("CI=true but docker-compose.redis.yml is missing", pytrace=False)
        pytest.skip("no docker-compose.redis.yml yet")
    return yaml.safe_load(COMPOSE_REDIS.read_text(encoding="utf-8"))


def test_compose_redis_profile_names_the_same_variables() -> None:
    """The compose file's replicas and gateway (the containers run here, A's tests)
    and the manifests' model and gateway pods set the same variables (a secret as
    ``<NAME>`` or ``<NAME>_FILE`` counts as one), and run the same commands."""
    services = compose_redis()["services"]
    (model,) = by_role("model")
    (gateway,) = by_role("gateway")
    pairs = [(services["replica-1"], model), (services["replica-2"], model)]
    pairs.append((services["gateway"], gateway))
    for service, workload in pairs:
        (container,) = containers(workload)
        compose_names = {plain_name(n) for n in service["environment"]}
        kube_names = {plain_name(n) for n in env_of(container)}
        assert compose_names == kube_names, workload["metadata"]["name"]
        assert service["command"][0] == container["args"][0]
    replica_cmd = services["replica-1"]["command"]
    assert replica_cmd[:3] == containers(model)[0]["args"][:3]  # model --config <same file>
    for name in ("MORTRED_LISTEN_PORT", "MORTRED_HEALTH_URL"):
        assert services["replica-1"]["environment"][name] == env_of(containers(model)[0])[name]
    redis_cmd = services["redis"]["command"]
    (redis,) = [w for w in workloads() if w["kind"] == "StatefulSet"]
    assert containers(redis)[0]["command"] == redis_cmd
    assert containers(redis)[0]["image"] == services["redis"]["image"].split(":-")[1].rstrip("}")
