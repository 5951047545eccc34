"""compose/kubernetes/: every object passes Kubernetes's own schema (kubernetes-validate, strict,
offline), `kubectl kustomize` builds the same objects where kubectl is installed, and a test that
reads the YAML checks what a schema cannot: every container runs a real role and probes its own
health, and every ConfigMap, Secret key, claim, volume, port and Service it names resolves.

No cluster is reached here: nothing is applied."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest
import yaml

from clockq.stack import preflight
from tests.compose.deploy_files import (
    KUBERNETES_DIR,
    healthcheck_role,
    image_uid,
    make_secrets,
    runstack_role,
    settings_read_from_files,
)

AUTOSCALING = KUBERNETES_DIR / "autoscaling"
# The oldest Kubernetes release still supported upstream when this was written, and the newest
# whose schemas kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.32.0", "1.37.0")
CONTROL_PLANE = ("web", "beat", "control", "predictor", "flower")
KUBECTL = shutil.which("kubectl")


def kustomization() -> dict:
    return yaml.safe_load((KUBERNETES_DIR / "kustomization.yaml").read_text())


def objects() -> list[dict]:
    """The objects the kustomization lists, in its namespace (what `kubectl apply -k` sends)."""
    namespace = kustomization()["namespace"]
    found = []
    for name in kustomization()["resources"]:
        for document in yaml.safe_load_all((KUBERNETES_DIR / name).read_text()):
            if document["kind"] != "Namespace":
                document["metadata"].setdefault("namespace", namespace)
            found.append(document)
    return found


def autoscalers() -> list[dict]:
    return [yaml.safe_load((AUTOSCALING / name).read_text()) for name in ("hpa.yaml", "keda-scaledobject.yaml")]


def find(kind: str, name: str) -> dict:
    [found] = [o for o in objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def workloads() -> dict[str, dict]:
    """Deployments and StatefulSets by the role their one container runs."""
    found = {}
    for o in objects():
        if o["kind"] in ("Deployment", "StatefulSet"):
            [container] = o["spec"]["template"]["spec"]["containers"]
            found[runstack_role(container["args"])] = o
    return found


def containers() -> Iterator[tuple[str, dict, dict]]:
    """(role, pod spec, container) of every workload."""
    for role, workload in workloads().items():
        pod = workload["spec"]["template"]["spec"]
        for container in pod["containers"]:
            yield role, pod, container


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_passes_kubernetes_schemas(version):
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate (requirements-dev.txt) is not installed"
    )
    built_in = [o for o in objects() + autoscalers() if "." not in o["apiVersion"].split("/")[0]]
    assert {o["kind"] for o in built_in} >= {"Deployment", "StatefulSet", "Service", "ConfigMap"}
    for o in built_in:
        kubernetes_validate.validate(o, version, strict=True)  # ValidationError names the field


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed: the kustomization is read by the test alone")
def test_kubectl_kustomize_builds_the_same_objects():
    done = subprocess.run([KUBECTL, "kustomize", str(KUBERNETES_DIR)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    built = list(yaml.safe_load_all(done.stdout))

    def names(found):
        return sorted((o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in found)

    assert names(built) == names(objects())
    pods = [o["spec"]["template"]["spec"] for o in built if o["kind"] in ("Deployment", "StatefulSet")]
    images = {container["image"] for pod in pods for container in pod["containers"]}
    assert images == {"clockq:latest", "clockq-gpu:latest"}


def test_each_control_plane_role_is_a_deployment_and_the_gpu_workers_a_statefulset():
    kinds = {role: workload["kind"] for role, workload in workloads().items()}

    assert kinds == {**dict.fromkeys(CONTROL_PLANE, "Deployment"), "gpu": "StatefulSet"}
    assert sorted(kinds) == sorted(preflight.ROLES)
    # one beat; a second would wait on the beat lock (beat.yaml says so)
    assert workloads()["beat"]["spec"]["replicas"] == 1
    assert "lock" in (KUBERNETES_DIR / "beat.yaml").read_text()


def test_every_container_runs_its_role_behind_tini():
    for role, _pod, container in containers():
        # `command` would replace the image's entrypoint (tini); the role is in `args`
        assert "command" not in container, role
        assert container["image"] == ("clockq-gpu" if role == "gpu" else "clockq")


def test_the_gpu_workers_ask_for_nvidia_gpus_and_time_to_checkpoint():
    gpu = workloads()["gpu"]
    pod = gpu["spec"]["template"]["spec"]
    [container] = pod["containers"]

    assert container["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["terminationGracePeriodSeconds"] >= 60 + 20  # gpuworkers' stop grace, and some
    # its governing Service is headless, and the pods' stable names are their CLOCKQ_HOST
    assert find("Service", gpu["spec"]["serviceName"])["spec"]["clusterIP"] == "None"
    [host] = [e for e in container["env"] if e["name"] == "CLOCKQ_HOST"]
    assert host["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    for role, _pod, other in containers():
        assert role == "gpu" or "nvidia.com/gpu" not in str(other["resources"]), role


def test_every_container_has_resources_and_probes_that_ask_about_its_own_role():
    for role, _pod, container in containers():
        assert {"cpu", "memory"} <= set(container["resources"]["requests"]), role
        assert "memory" in container["resources"]["limits"], role
        probes = {k: v for k, v in container.items() if k.endswith("Probe")}
        assert "livenessProbe" in probes or "readinessProbe" in probes, role
        ports = {p["name"] for p in container.get("ports", [])}
        for kind, probe in probes.items():
            if "exec" in probe:
                assert healthcheck_role(probe["exec"]["command"]) == role, (role, kind)
                assert probe["timeoutSeconds"] >= 10, (role, kind)  # Django starts in the probe
            else:
                assert probe["httpGet"]["port"] in ports, (role, kind)


def test_the_web_role_answers_its_probes_and_its_service_by_name():
    [container] = workloads()["web"]["spec"]["template"]["spec"]["containers"]
    headers = {h["name"]: h["value"] for h in container["readinessProbe"]["httpGet"]["httpHeaders"]}
    allowed = find("ConfigMap", "clockq-config")["data"]["ALLOWED_HOSTS"].split(",")

    # Django answers 400 to a host it does not know: the probe's, and the Service's names
    assert headers["Host"] in allowed
    assert {"clockq-web", "clockq-web.clockq.svc"} <= set(allowed)
    # readiness does not hang on /healthz, which is 503 while no GPU worker takes jobs
    assert container["readinessProbe"]["httpGet"]["path"] != "/healthz"


def test_every_reference_resolves_within_the_manifests(tmp_path):
    secret_keys = set(make_secrets(tmp_path / "secrets"))
    claims = {o["metadata"]["name"] for o in objects() if o["kind"] == "PersistentVolumeClaim"}
    config_maps = {o["metadata"]["name"]: o["data"] for o in objects() if o["kind"] == "ConfigMap"}
    for role, pod, container in containers():
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes, (role, mount)
        for volume in volumes.values():
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, role
            if "secret" in volume:
                # the Secret `clockq` is made by hand from compose/make-secrets.sh's files
                assert volume["secret"]["secretName"] == "clockq"
                assert {item["key"] for item in volume["secret"]["items"]} <= secret_keys, role
        for source in container.get("envFrom", []):
            assert source["configMapRef"]["name"] in config_maps, role
        assert_file_settings_are_mounted(role, container, volumes, config_maps)


def assert_file_settings_are_mounted(role: str, container: dict, volumes: dict, config_maps: dict) -> None:
    """Each *_FILE setting names a file of the container's Secret volume, for a setting that clockq
    reads from a file."""
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    for source in container.get("envFrom", []):
        env.update(config_maps[source["configMapRef"]["name"]])
    mounted = set()
    for mount in container["volumeMounts"]:
        secret = volumes[mount["name"]].get("secret")
        if secret:
            mounted |= {f"{mount['mountPath']}/{item['path']}" for item in secret["items"]}
    files = {name.removesuffix("_FILE"): path for name, path in env.items() if name.endswith("_FILE")}
    assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY"} <= set(files), role
    assert set(files) <= settings_read_from_files(), role
    assert set(files.values()) <= mounted, role
    assert not set(files) & set(env), role  # never the plain setting beside its file


def test_the_checkpoint_folder_is_one_shared_claim_where_checkpoints_are_kept():
    folder = find("ConfigMap", "clockq-config")["data"]["CLOCKQ_CHECKPOINT_DIR"]
    claim = find("PersistentVolumeClaim", "clockq-checkpoints")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for role, pod, container in containers():
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        at = {m["mountPath"]: volumes[m["name"]] for m in container.get("volumeMounts", [])}
        if role in {"web"} | preflight.CHECKPOINT_ROLES:
            assert at[folder]["persistentVolumeClaim"]["claimName"] == "clockq-checkpoints", role


def test_pods_run_as_the_images_user_without_service_links():
    for role, workload in workloads().items():
        pod = workload["spec"]["template"]["spec"]
        # service links would set FLOWER_PORT=tcp://… and the like, which clockq reads as settings
        assert pod["enableServiceLinks"] is False, role
        assert pod["securityContext"]["runAsNonRoot"] is True, role
        assert pod["securityContext"]["runAsUser"] == image_uid(), role


def test_services_select_pods_and_ports_that_exist():
    for service in (o for o in objects() if o["kind"] == "Service"):
        selected = [
            w
            for w in workloads().values()
            if service["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(selected) == 1, service["metadata"]["name"]
        [container] = selected[0]["spec"]["template"]["spec"]["containers"]
        for port in service["spec"].get("ports", []):
            assert port["targetPort"] in {p["name"] for p in container["ports"]}


def test_the_autoscalers_size_the_gpu_statefulset_by_the_desired_workers_gauge():
    gpu = workloads()["gpu"]
    for scaler in autoscalers():
        target = scaler["spec"]["scaleTargetRef"]
        assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "StatefulSet", "clockq-gpu")
        assert scaler["metadata"]["namespace"] == gpu["metadata"]["namespace"]
    hpa, keda = autoscalers()
    assert hpa["spec"]["metrics"][0]["external"]["metric"]["name"] == "clockq_desired_gpu_workers"
    assert (keda["apiVersion"], keda["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    assert keda["spec"]["triggers"][0]["metadata"]["query"] == "max(clockq_desired_gpu_workers)"
    assert keda["spec"]["minReplicaCount"] <= keda["spec"]["maxReplicaCount"]
    assert hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
