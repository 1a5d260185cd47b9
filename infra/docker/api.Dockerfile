# syntax=docker/dockerfile:1
# The control plane: `draftsmith api`, `draftsmith db upgrade`, `draftsmith keys`. No torch: pyproject.toml's base
# dependencies are the API's, and the trainer, kernels and worker sources are not even copied in.
#
#   docker build -f infra/docker/api.Dockerfile -t draftsmith-api .        # from the repository root

FROM python:3.11.14-slim-bookworm AS build
# pipefail: a failing `requirement.py` must fail the build, not feed xargs nothing.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/draftsmith
ENV PATH=/opt/draftsmith/bin:$PATH
WORKDIR /src
COPY pyproject.toml infra/docker/requirement.py ./
# Dependencies first (pinned in pyproject.toml): this layer survives code changes.
RUN python requirement.py --extra | xargs pip install
COPY README.md ./
COPY api api
COPY domain domain
COPY schemas schemas
COPY report report
COPY migrations migrations
COPY draftsmith draftsmith
RUN pip install --no-deps . && draftsmith --version

FROM python:3.11.14-slim-bookworm
RUN groupadd --system --gid 10001 draftsmith \
 && useradd --system --uid 10001 --gid draftsmith --create-home --home-dir /home/draftsmith draftsmith
COPY --from=build /opt/draftsmith /opt/draftsmith
ENV PATH=/opt/draftsmith/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /home/draftsmith
USER 10001:10001
EXPOSE 8000
# One process per container: Kubernetes scales pods; compose passes --workers.
CMD ["draftsmith", "api", "--host", "0.0.0.0", "--port", "8000"]
