"""The multi-node train stage as the manifests deploy it: the hostfile they render names the trainer pods by their
headless-Service DNS names with their GPUs as slots, DeepSpeed's own parser accepts it, and the settings the
trainer pod starts with lead, through the worker's own code, to the DeepSpeed-launcher command of
trainer/training/launch.py. One source: the values come from the rendered manifests, the command from the code."""

from __future__ import annotations

import re

from deepspeed.launcher.runner import _parse_hostfile, fetch_hostfile, parse_args
from infra_files import ROOT, config_map_data, container, one, pod_environment, read_env_file, render, settings_from

from trainer.training.launch import training_command
from worker.job_files import launch_for

SCRIPT = (ROOT / "infra" / "docker" / "trainer-node.sh").read_text()
GPU_DOCKERFILE = (ROOT / "infra" / "docker" / "worker-gpu.Dockerfile").read_text()
# The deployer's Secret, as the example shows it (the secret key filled in).
SECRETS = read_env_file(ROOT / "infra" / "k8s" / "secrets.env.example") | {"DRAFTSMITH_SECRET_KEY": "s" * 48}


def trainer():
    docs = render("multinode")
    return docs, one(docs, "StatefulSet", "draftsmith-trainer")


def mounted_hostfile(docs, statefulset) -> tuple[str, str]:
    """(path inside the pod, content) of the hostfile ConfigMap as the StatefulSet mounts it."""
    volumes = {v["name"]: v for v in statefulset["spec"]["template"]["spec"]["volumes"]}
    mount = next(m for m in container(statefulset)["volumeMounts"] if m["name"] == "hostfile")
    (key, content), = config_map_data(docs, volumes["hostfile"]["configMap"]["name"]).items()
    return f"{mount['mountPath']}/{key}", content


def pod_settings():
    docs, statefulset = trainer()
    return settings_from(pod_environment(docs, statefulset, SECRETS))


def test_the_hostfile_names_every_trainer_pod_by_its_headless_service_name_with_its_gpus():
    docs, statefulset = trainer()
    _, content = mounted_hostfile(docs, statefulset)
    pool = _parse_hostfile(content.splitlines())  # DeepSpeed's own reading of a hostfile
    name, replicas = statefulset["metadata"]["name"], statefulset["spec"]["replicas"]
    service = one(docs, "Service", statefulset["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert list(pool) == [f"{name}-{ordinal}.{service['metadata']['name']}" for ordinal in range(replicas)]
    gpus = container(statefulset)["resources"]["limits"]["nvidia.com/gpu"]
    assert set(pool.values()) == {int(gpus)}
    assert replicas >= 2


def test_the_trainer_pod_settings_lead_to_the_deepspeed_launcher_over_the_mounted_hostfile(tmp_path):
    docs, statefulset = trainer()
    path, content = mounted_hostfile(docs, statefulset)
    settings = pod_settings()
    assert settings.worker_hostfile == path
    launch = launch_for(settings)  # what the worker's train stage is given (worker/job_files.py)
    assert launch.nproc == int(container(statefulset)["resources"]["limits"]["nvidia.com/gpu"])
    spec = tmp_path / "launch.json"
    command = training_command(launch.nproc, launch.hostfile, spec, 29500)
    assert command == ["deepspeed", f"--hostfile={path}", "--master_port=29500", "--module",
                       "trainer.training.launch", str(spec)]
    # DeepSpeed's launcher reads this command as meant, and the hostfile it names as the rendered one.
    args = parse_args(command[1:])
    assert (args.hostfile, args.module, args.user_script, args.user_args) == (
        path, True, "trainer.training.launch", [str(spec)])
    local = tmp_path / "hostfile"
    local.write_text(content)
    pool = fetch_hostfile(str(local))
    assert sum(pool.values()) == statefulset["spec"]["replicas"] * launch.nproc  # the world size


def test_one_node_gpu_workers_train_under_torchrun_on_their_own_gpus():
    docs = render("gpu")
    worker = one(docs, "Deployment", "draftsmith-worker-gpu")
    launch = launch_for(settings_from(pod_environment(docs, worker, SECRETS)))
    assert launch.hostfile is None
    assert launch.nproc == int(container(worker)["resources"]["limits"]["nvidia.com/gpu"])


def test_the_trainer_node_script_matches_the_manifest():
    docs, statefulset = trainer()
    spec = container(statefulset)
    # The image installs the script under the name the StatefulSet runs, under tini.
    installed = re.search(r"COPY --chmod=755 infra/docker/trainer-node.sh (\S+)", GPU_DOCKERFILE)[1]
    assert spec["command"] == ["tini", "--", installed.rsplit("/", 1)[1]]
    assert spec["image"] == container(one(render("gpu"), "Deployment", "draftsmith-worker-gpu"))["image"]
    port = int(re.search(r"^SSH_PORT=(\d+)$", SCRIPT, re.MULTILINE)[1])
    assert {p["name"]: p["containerPort"] for p in spec["ports"]}["ssh"] == port
    assert one(docs, "Service", "draftsmith-trainer")["spec"]["ports"][0]["port"] == port
    secret_dir = re.search(r"^SSH_SECRET_DIR=(\S+)", SCRIPT, re.MULTILINE)[1]
    mounts = {m["name"]: m["mountPath"] for m in spec["volumeMounts"]}
    assert mounts["ssh"] == secret_dir
    # The worker, and so the launcher and rank 0, runs on ordinal 0: the first host of the hostfile.
    assert 'ordinal="${HOSTNAME##*-}"' in SCRIPT and '"$ordinal" != "0"' in SCRIPT
    path, content = mounted_hostfile(docs, statefulset)
    assert next(iter(_parse_hostfile(content.splitlines()))).startswith(f"{statefulset['metadata']['name']}-0.")
    # Every rank reads and writes the same paths: the worker cache is one ReadWriteMany volume on every pod.
    volumes = {v["name"]: v for v in statefulset["spec"]["template"]["spec"]["volumes"]}
    claim = one(docs, "PersistentVolumeClaim", volumes["shared"]["persistentVolumeClaim"]["claimName"])
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    # The cache directory is the image's (the manifests do not override it), and it lies on that volume.
    cache_dir = re.search(r"DRAFTSMITH_WORKER_CACHE_DIR=(\S+)", GPU_DOCKERFILE)[1]
    assert cache_dir.startswith(mounts["shared"] + "/")
    assert "DRAFTSMITH_WORKER_CACHE_DIR" not in pod_environment(docs, statefulset, SECRETS)
