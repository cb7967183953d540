# coroner-operator image. Build from the repository root:
#   docker build -f images/operator.Dockerfile -t ghcr.io/coroner-dev/coroner-operator:v0.1.0 .
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
# The operator needs no root and no writable filesystem.
USER 65532:65532
ENTRYPOINT ["coroner-operator"]
