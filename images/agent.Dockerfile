# coroner-agent image. Build from the repository root:
#   docker build -f images/agent.Dockerfile -t ghcr.io/coroner-dev/coroner-agent:v0.1.0 .
# Locally, with no container engine: `coroner dev-cluster images` builds it with buildah (no daemon,
# `--isolation chroot`) on a stand-in base made from Debian bookworm's python3.11 and passed as
# `--build-arg BASE=...`, into an OCI archive for `ctr -n k8s.io images import --local`.
# It installs exactly the 'agent' extra, from its hashed lock (images/agent.lock, made by
# `make locks`), and only the source roots it runs: never the dev cluster, the demo or the CLI's
# kubernetes package.
ARG BASE=python:3.11.7-slim-bookworm
FROM ${BASE} AS build
WORKDIR /src
COPY images/agent.lock ./
RUN pip install --no-cache-dir --prefix=/install --require-hashes --only-binary=:all: -r agent.lock
COPY pyproject.toml README.md LICENSE ./
COPY src/coroner ./src/coroner
COPY node-agent/src ./node-agent/src
RUN pip install --no-cache-dir --prefix=/install --no-deps .

FROM ${BASE}
COPY --from=build /install /usr/local
# Runs as root with only CAP_SYS_PTRACE (see manifests/base/agent.yaml for why): reading another
# user's /proc/<pid>/ns/pid is a ptrace-mode read.
ENTRYPOINT ["coroner-agent"]
