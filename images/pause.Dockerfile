# The dev cluster's sandbox ("pause") image: Debian's catatonit in pause mode, for containerd's
# sandbox_image. TEST-ONLY (the registry's registry.k8s.io/pause cannot be pulled here); built by
# `coroner dev-cluster images` as localhost/coroner-dev/pause:catatonit. BASE must hold Debian's
# /usr/bin/catatonit (statically linked): the stand-in Debian base that command makes does.
ARG BASE
FROM ${BASE} AS catatonit

FROM scratch
COPY --from=catatonit /usr/bin/catatonit /catatonit
USER 65535:65535
ENTRYPOINT ["/catatonit", "-P"]
