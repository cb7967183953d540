# coroner-worker image: TEST-ONLY, for the dev cluster's end-to-end tests; never shipped or deployed.
# Built with the others by `coroner dev-cluster images` (buildah, on the stand-in Debian base) as
# localhost/coroner-dev/coroner-worker:dev.
# It holds the launcher (`coroner run`, which needs only the base dependencies: installed from the
# agent's hashed lock, a superset) and `coroner-test-worker` (images/worker/coroner-test-worker.py):
# sleeps printing its pid; with SECONDS [CODE], exits CODE after SECONDS; SIGTERM exits 0.
# In a pod: args ["-n", "$(POD_NAMESPACE)", "--", "coroner-test-worker", ...], NODE_NAME from
# spec.nodeName, and a ServiceAccount allowed to create WorkerRegistrations.
ARG BASE=python:3.11.7-slim-bookworm
FROM ${BASE} AS build
WORKDIR /src
COPY images/agent.lock ./
RUN pip install --no-cache-dir --prefix=/install --require-hashes --only-binary=:all: -r agent.lock
COPY pyproject.toml README.md LICENSE ./
COPY src/coroner ./src/coroner
RUN pip install --no-cache-dir --prefix=/install --no-deps .

FROM ${BASE}
COPY --from=build /install /usr/local
COPY images/worker/coroner-test-worker.py /usr/local/bin/coroner-test-worker
USER 65532:65532
ENTRYPOINT ["coroner", "run"]
