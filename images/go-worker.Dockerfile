# go-worker image: TEST-ONLY, for the real-node tests of the registrar; never shipped or deployed.
# A worker whose image holds nothing of Coroner: no shell, no Python, only a static Go binary
# (images/go-worker/, no dependencies). `coroner dev-cluster images` builds the binary first
# (CGO_ENABLED=0 go build -trimpath, into images/go-worker/go-worker of the staged context: the
# Go sources are inputs of the images' cache key, the binary is not) and then this image, as
# localhost/coroner-dev/go-worker:dev. By hand, from the repository root:
#   (cd images/go-worker && CGO_ENABLED=0 go build -trimpath -o go-worker .)
#   docker build -f images/go-worker.Dockerfile -t localhost/coroner-dev/go-worker:dev .
# Usage (images/go-worker/main.go): go-worker [SECONDS [CODE]]; SIGTERM exits 0;
# GO_WORKER_ALLOCATE_MIB=N allocates N MiB (an OOM kill under a smaller memory limit).
FROM scratch
COPY images/go-worker/go-worker /go-worker
USER 65532:65532
ENTRYPOINT ["/go-worker"]
