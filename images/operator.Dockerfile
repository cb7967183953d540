# coroner-operator image. Build from the repository root:
#   docker build -f images/operator.Dockerfile -t ghcr.io/coroner-dev/coroner-operator:v0.1.0 .
# Locally, with no container engine: `coroner dev-cluster images` builds it with buildah (no daemon,
# `--isolation chroot`) on a stand-in base made from Debian bookworm's python3.11 and passed as
# `--build-arg BASE=...`, into an OCI archive for `ctr -n k8s.io images import --local`.
# It installs the 'operator' extra and the 'cli' extra, from its hashed lock (images/operator.lock,
# made by `make locks`), and only the source roots it runs: never the dev cluster or the demo. The
# CLI is here for the chart's `helm test`, which runs `kubectl-coroner doctor` from this image in the
# cluster (charts/coroner/templates/tests/); the operator itself never imports it.
ARG BASE=python:3.11.7-slim-bookworm
FROM ${BASE} AS build
WORKDIR /src
COPY images/operator.lock ./
# The kubernetes package ships an asyncio client beside the synchronous one the CLI uses (kubernetes/aio:
# 62 MiB of the image with its bytecode, imported by nothing else): removed.
RUN pip install --no-cache-dir --prefix=/install --require-hashes --only-binary=:all: -r operator.lock \
 && rm -r /install/lib/python3*/site-packages/kubernetes/aio
COPY pyproject.toml README.md LICENSE ./
COPY src/coroner ./src/coroner
COPY operator/src ./operator/src
RUN pip install --no-cache-dir --prefix=/install --no-deps .

FROM ${BASE}
COPY --from=build /install /usr/local
# The operator needs no root and no writable filesystem.
USER 65532:65532
ENTRYPOINT ["coroner-operator"]
