"""A stand-in image registry for the strict boot: a read-only Docker Registry HTTP API v2 that serves
the image of a `docker save` tar, as a pool's environment image would come from Docker Hub or a
cloud's registry (none is reachable here).

Only what a pull asks: `GET /v2/` (the version check), the manifest by tag or digest (an OCI image
manifest, built from the tar's manifest.json: its config blob and its layers, uncompressed, as
`docker save` wrote them) and the blobs by digest, streamed from their place in the tar. Served on
127.0.0.1, which Docker engines treat as an insecure registry by default (plain HTTP, no TLS). Every
request is recorded (`requests`), so a test can tell the image came from here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
_PATH = re.compile(r"^/v2/(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)$")


@dataclass(frozen=True)
class _Blob:
    offset: int  # of its data in the tar
    size: int


def _sha256_member(f: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    h = hashlib.sha256()
    src = f.extractfile(member)
    assert src is not None
    while chunk := src.read(1 << 20):
        h.update(chunk)
    return "sha256:" + h.hexdigest()


def saved_image(client: Any, ref: str, cache: Path) -> Path:
    """`docker save` of `ref` from the engine of `client` (a docker.DockerClient), kept in `cache`
    under the image's id (made once)."""
    image_id = client.api.inspect_image(ref)["Id"].split(":")[-1]
    dest = cache / f"{image_id[:16]}.tar"
    if not dest.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            for chunk in client.api.get_image(ref):
                f.write(chunk)
        os.replace(tmp, dest)
    return dest


class SavedImageRegistry:
    """Serves the (first) image of the saved tar as `repository:tag` (a path without the registry's
    host) at this registry's address, `image`."""

    def __init__(self, saved_tar: Path, repository: str, tag: str) -> None:
        self.tar = saved_tar
        self.repository = repository
        self.tag = tag
        self.requests: list[tuple[str, str]] = []  # (method, path)
        self._blobs: dict[str, _Blob] = {}
        self._manifest = self._load()
        self.manifest_digest = "sha256:" + hashlib.sha256(self._manifest).hexdigest()
        self.address = ""  # host:port, while running()

    def _load(self) -> bytes:
        with tarfile.open(self.tar) as f:
            members = {m.name.lstrip("./"): m for m in f.getmembers()}
            manifest_file = f.extractfile(members["manifest.json"])
            assert manifest_file is not None
            [image] = json.load(manifest_file)[:1]
            config = members[image["Config"]]
            config_digest = _sha256_member(f, config)
            self._blobs[config_digest] = _Blob(config.offset_data, config.size)
            layers = []
            for name in image["Layers"]:
                m = members[name]
                digest = _sha256_member(f, m)
                self._blobs[digest] = _Blob(m.offset_data, m.size)
                layers.append({"mediaType": LAYER_TYPE, "digest": digest, "size": m.size})
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE,
                    "config": {"mediaType": CONFIG_TYPE, "digest": config_digest, "size": config.size},
                    "layers": layers}
        return json.dumps(manifest, separators=(",", ":")).encode()

    # -- the server ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def running(self) -> Iterator[SavedImageRegistry]:
        """Served on a free port of 127.0.0.1 for the duration of the block."""
        server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True, name="stand-in-registry").start()
        self.address = f"127.0.0.1:{server.server_address[1]}"
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()

    @property
    def image(self) -> str:
        """The image's reference at this registry."""
        return f"{self.address}/{self.repository}:{self.tag}"

    def pulled(self) -> bool:
        """Whether every blob of the image was fetched whole (GET) at least once."""
        got = {path.rsplit("/", 1)[-1] for method, path in self.requests if method == "GET"}
        return set(self._blobs) <= got

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def _answer(self, body: bool) -> None:
                registry.requests.append((self.command, self.path))
                path = self.path.split("?", 1)[0]
                if path in ("/v2", "/v2/"):
                    return self._send(200, b"{}", "application/json", body)
                m = _PATH.match(path)
                if m is None or m["name"] != registry.repository:
                    return self._error(404, "NAME_UNKNOWN", "repository name not known to registry", body)
                if m["kind"] == "manifests":
                    if m["ref"] not in (registry.tag, registry.manifest_digest):
                        return self._error(404, "MANIFEST_UNKNOWN", "manifest unknown", body)
                    return self._send(200, registry._manifest, MANIFEST_TYPE, body,
                                      digest=registry.manifest_digest)
                blob = registry._blobs.get(m["ref"])
                if blob is None:
                    return self._error(404, "BLOB_UNKNOWN", "blob unknown to registry", body)
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(blob.size))
                self.send_header("Docker-Content-Digest", m["ref"])
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                self.end_headers()
                if body:
                    with open(registry.tar, "rb") as f:
                        f.seek(blob.offset)
                        left = blob.size
                        while left > 0:
                            chunk = f.read(min(left, 1 << 20))
                            if not chunk:
                                break
                            self.wfile.write(chunk)
                            left -= len(chunk)

            def _send(self, status: int, data: bytes, ctype: str, body: bool, digest: str | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                if digest:
                    self.send_header("Docker-Content-Digest", digest)
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def _error(self, status: int, code: str, message: str, body: bool) -> None:
                data = json.dumps({"errors": [{"code": code, "message": message, "detail": None}]}).encode()
                self._send(status, data, "application/json", body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler
