# coroner-agent image. Build from the repository root:
#   docker build -f images/agent.Dockerfile -t ghcr.io/coroner-dev/coroner-agent:v0.1.0 .
# (Images cannot be built on the project's development machines, which have no container engine.)
FROM python:3.11.7-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
COPY operator ./operator
COPY node-agent ./node-agent
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11.7-slim-bookworm
COPY --from=build /install /usr/local
# Runs as root with only CAP_SYS_PTRACE (see manifests/base/agent.yaml for why): reading another
# user's /proc/<pid>/ns/pid is a ptrace-mode read.
ENTRYPOINT ["coroner-agent"]
