"""OCI image layouts as the dev cluster hands them to containerd: the index annotations containerd's
own export writes, a layer's uncompressed size, and the layout packed as a reproducible tar."""

from __future__ import annotations

import pathlib
import tarfile
import zlib

from coroner_dev.devcluster import imagerecipe

MEDIA_LAYER_GZIP = ("application/vnd.oci.image.layer.v1.tar+gzip", "application/vnd.docker.image.rootfs.diff.tar.gzip")


def containerd_annotations(reference: str) -> dict[str, str]:
    """How containerd's own export names an image in an archive's index: the full reference, and
    the OCI ref name (the tag)."""
    _, tag = imagerecipe.split_reference(reference)
    return {"io.containerd.image.name": reference, "org.opencontainers.image.ref.name": tag}


def blob(layout: pathlib.Path, digest: str) -> pathlib.Path:
    algorithm, _, encoded = digest.partition(":")
    return layout / "blobs" / algorithm / encoded


def uncompressed_size(path: pathlib.Path, media_type: str) -> int:
    if media_type not in MEDIA_LAYER_GZIP:
        return path.stat().st_size
    total = 0
    decompressor = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            total += len(decompressor.decompress(chunk))
    return total + len(decompressor.flush())


def pack(layout: pathlib.Path, archive: pathlib.Path) -> None:
    """An OCI layout directory as a tar (sorted, root-owned, time 0: the same bytes for the same image)."""

    def normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        info.mode = 0o755 if info.isdir() else 0o644
        return info

    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(layout.rglob("*")):
            tar.add(path, arcname=path.relative_to(layout).as_posix(), recursive=False, filter=normalize)
