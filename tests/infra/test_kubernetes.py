"""infra/k8s: each overlay renders offline (`kubectl kustomize`), validates against the Kubernetes schemas, and
holds what a deployer relies on: probes on the API's health routes, GPUs requested where training runs, a consumer
for every stage's queue, autoscaling on the queues the workers consume, disruption budgets, non-root pods."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest
from infra_files import (
    KUBERNETES_VERSION,
    OVERLAYS,
    ROOT,
    config_map_data,
    consumed_kinds,
    container,
    find,
    one,
    pod_spec,
    render,
    workloads,
)

from api.main import MULTIPART_OVERHEAD
from domain.queue import queue_for
from domain.settings import Settings
from schemas.stages import STAGE_QUEUE, Stage

CUSTOM_RESOURCES = {"keda.sh/v1alpha1"}  # KEDA's; kubernetes-validate knows only the built-in kinds


def validation_errors(doc: dict) -> list[str]:
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{doc['kind']} {doc['metadata']['name']}: {error.message} at {list(error.path)}"]
    return []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates_against_the_kubernetes_schemas(overlay):
    docs = render(overlay)
    builtin = [doc for doc in docs if doc["apiVersion"] not in CUSTOM_RESOURCES]
    assert [error for doc in builtin for error in validation_errors(doc)] == []
    kinds = {doc["kind"] for doc in docs}
    assert {"Deployment", "Service", "Ingress", "HorizontalPodAutoscaler", "Job", "PodDisruptionBudget",
            "ConfigMap", "ScaledObject"} <= kinds


def test_strict_validation_rejects_a_misspelt_field():
    deployment = one(render("gpu"), "Deployment", "draftsmith-api")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    assert validation_errors(broken)


def test_the_api_is_probed_on_its_health_routes_and_served_through_service_and_ingress():
    docs = render("gpu")
    api = one(docs, "Deployment", "draftsmith-api")
    spec = container(api)
    port = {p["name"]: p["containerPort"] for p in spec["ports"]}["http"]
    assert spec["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert spec["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert spec["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert spec["args"][-2:] == ["--port", str(port)]
    service = one(docs, "Service", "draftsmith-api")
    assert service["spec"]["selector"] == api["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    backend = one(docs, "Ingress", "draftsmith-api")["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == "draftsmith-api" and backend["port"]["name"] == service["spec"]["ports"][0]["name"]
    hpa = one(docs, "HorizontalPodAutoscaler", "draftsmith-api")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "draftsmith-api"}
    assert hpa["spec"]["minReplicas"] >= 2


def test_the_ingress_lets_event_streams_and_uploads_through():
    annotations = one(render("gpu"), "Ingress", "draftsmith-api")["metadata"]["annotations"]
    defaults = Settings.model_fields
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert float(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) > defaults[
        "sse_max_stream_seconds"].default
    size = re.fullmatch(r"(\d+)m", annotations["nginx.ingress.kubernetes.io/proxy-body-size"])
    assert int(size[1]) * 2**20 >= defaults["max_upload_bytes"].default + MULTIPART_OVERHEAD


def test_migrations_run_as_a_job_with_the_api_image():
    docs = render("gpu")
    job = one(docs, "Job", "draftsmith-migrate")
    assert container(job)["args"] == ["draftsmith", "db", "upgrade"]
    assert container(job)["image"] == container(one(docs, "Deployment", "draftsmith-api"))["image"]


def worker_kinds(docs) -> dict[str, set[str]]:
    """Queue kinds per worker workload; the trainer node runs its worker from infra/docker/trainer-node.sh."""
    script = (ROOT / "infra" / "docker" / "trainer-node.sh").read_text()
    trainer_args = re.search(r"^exec (draftsmith worker .*)$", script, re.MULTILINE)[1].split()
    kinds = {}
    for workload in workloads(docs):
        spec = container(workload)
        if spec.get("command", [])[-1:] == ["draftsmith-trainer-node"]:
            kinds[workload["metadata"]["name"]] = consumed_kinds(trainer_args)
        elif spec.get("args", [])[:2] == ["draftsmith", "worker"]:
            kinds[workload["metadata"]["name"]] = consumed_kinds(spec["args"])
    return kinds


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_stage_has_a_worker_and_gpu_stages_run_on_gpus_where_there_are_any(overlay):
    docs = render(overlay)
    kinds = worker_kinds(docs)
    assert set().union(*kinds.values()) == set(STAGE_QUEUE.values())
    for name, consumed in kinds.items():
        workload = next(w for w in workloads(docs) if w["metadata"]["name"] == name)
        gpus = container(workload)["resources"]["limits"].get("nvidia.com/gpu")
        if overlay != "cpu" and "gpu" in consumed:
            assert gpus, f"{name} takes GPU stages without a GPU"
            assert pod_spec(workload)["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod_spec(
                workload)["tolerations"]
        if "gpu" not in consumed:
            assert gpus is None, f"{name} holds a GPU it never uses"
    if overlay == "cpu":
        assert "nvidia.com/gpu" not in str(docs)


def test_gpus_per_pod_match_the_training_processes():
    docs = render("gpu")
    worker = one(docs, "Deployment", "draftsmith-worker-gpu")
    spec = container(worker)
    nproc = config_map_data(docs, spec["envFrom"][1]["configMapRef"]["name"])["DRAFTSMITH_WORKER_NPROC"]
    assert spec["resources"]["limits"]["nvidia.com/gpu"] == spec["resources"]["requests"]["nvidia.com/gpu"] == nproc


def test_a_jobs_generate_helpers_fit_the_gpu_pods_keda_may_start():
    """The helpers a generate stage asks for wait on the gpu queue, which scales the GPU workers: more helpers than
    the scaler's most pods would only wait."""
    docs = render("gpu")
    spec = container(one(docs, "Deployment", "draftsmith-worker-gpu"))
    helpers = int(config_map_data(docs, spec["envFrom"][1]["configMapRef"]["name"])["DRAFTSMITH_WORKER_GENERATE_WORKERS"])
    assert 1 < helpers <= one(docs, "ScaledObject", "draftsmith-worker-gpu")["spec"]["maxReplicaCount"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workers_scale_on_the_length_of_the_queues_they_consume(overlay):
    docs = render(overlay)
    settings_data = config_map_data(docs, container(one(docs, "Deployment", "draftsmith-api"))["envFrom"][0][
        "configMapRef"]["name"])
    queue_name = settings_data.get("DRAFTSMITH_QUEUE_NAME", Settings.model_fields["queue_name"].default)
    settings = Settings.model_construct(queue_name=queue_name)
    kinds = worker_kinds(docs)
    scaled = find(docs, "ScaledObject")
    assert {s["spec"]["scaleTargetRef"]["name"] for s in scaled} == {
        w["metadata"]["name"] for w in find(docs, "Deployment") if w["metadata"]["name"] in kinds}
    for scaler in scaled:
        target = scaler["spec"]["scaleTargetRef"]["name"]
        lists = {trigger["metadata"]["listName"] for trigger in scaler["spec"]["triggers"]}
        expected = {queue_for(settings, stage) for stage in Stage if STAGE_QUEUE[stage] in kinds[target]}
        assert lists == expected, target
        assert all(t["type"] == "redis" and t["authenticationRef"]["name"] == "draftsmith-redis"
                   for t in scaler["spec"]["triggers"])
        assert scaler["spec"]["minReplicaCount"] >= 1, "scaling to zero would stop a stage in progress"
    assert one(docs, "TriggerAuthentication", "draftsmith-redis")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_long_running_workload_has_a_disruption_budget_and_pods_run_as_non_root(overlay):
    docs = render(overlay)
    budgets = [pdb["spec"]["selector"]["matchLabels"] for pdb in find(docs, "PodDisruptionBudget")]
    for workload in workloads(docs):
        name = workload["metadata"]["name"]
        if workload["kind"] != "Job":
            assert workload["spec"]["selector"]["matchLabels"] in budgets, f"{name} has no PodDisruptionBudget"
        security = pod_spec(workload)["securityContext"]
        assert security["runAsNonRoot"] and security["runAsUser"] != 0, name
        assert container(workload)["securityContext"]["allowPrivilegeEscalation"] is False, name
        assert pod_spec(workload)["automountServiceAccountToken"] is False, name
