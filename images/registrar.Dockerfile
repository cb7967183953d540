# coroner-registrar image. Build from the repository root:
#   docker build -f images/registrar.Dockerfile -t ghcr.io/coroner-dev/coroner-registrar:v0.1.0 .
# Locally, with no container engine: `coroner dev-cluster images` builds it with buildah (no daemon,
# `--isolation chroot`) on a stand-in base made from Debian bookworm's python3.11 and passed as
# `--build-arg BASE=...`, into an OCI archive for `ctr -n k8s.io images import --local`.
# `coroner registrar` (a native sidecar that `kubectl coroner inject` or the registrar-injection
# component adds to Pods whose images hold nothing of Coroner; docs/architecture.md) needs only the
# base dependencies: installed from its hashed lock (images/registrar.lock, made by `make locks`),
# and only src/coroner: never the agent, the operator, the dev cluster or the CLI's kubernetes
# package.
ARG BASE=python:3.11.7-slim-bookworm
FROM ${BASE} AS build
WORKDIR /src
COPY images/registrar.lock ./
RUN pip install --no-cache-dir --prefix=/install --require-hashes --only-binary=:all: -r registrar.lock
COPY pyproject.toml README.md LICENSE ./
COPY src/coroner ./src/coroner
RUN pip install --no-cache-dir --prefix=/install --no-deps .

FROM ${BASE}
COPY --from=build /install /usr/local
# No root, no capability, a read-only root (coroner.core.inject.SECURITY_CONTEXT): what it reads in
# /proc and the pidfds it opens need none.
USER 65532:65532
ENTRYPOINT ["coroner"]
