"""Container images pinned to their digest through the registry's HTTP API (Docker Registry v2 / OCI).

A tag moves; a digest does not. ``resolve`` asks the registry for the
manifest a tag names now (``HEAD /v2/<name>/manifests/<tag>``, following the
bearer-token challenge Docker Hub answers with) and returns its digest; the
run then launches ``name@sha256:...`` and records it in runtime.lock.json.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from ..core import http
from ..core.errors import RegistryError

DOCKER_HUB = "https://registry-1.docker.io"
# what a multi-architecture image or a single manifest may be served as; the digest of the
# answer is what `docker pull name@digest` asks for
ACCEPT = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class ImageRef:
    registry: str  # base URL, e.g. https://registry-1.docker.io or http://127.0.0.1:5000
    host: str  # as written in the image name ("" for Docker Hub)
    repository: str  # e.g. library/ubuntu, vllm/vllm-openai
    tag: str | None
    digest: str | None

    @property
    def name(self) -> str:
        """The image name without tag or digest, as docker writes it."""
        if self.host:
            return f"{self.host}/{self.repository}"
        return self.repository.removeprefix("library/")

    def pinned(self, digest: str) -> str:
        return f"{self.name}@{digest}"


def parse(image: str, registry: str | None = None) -> ImageRef:
    """``[host[:port]/]path[:tag][@sha256:...]`` (docker's rules: the first part is a host if it has a
    dot or a port or is localhost; Docker Hub otherwise, with ``library/`` for one-part names)."""
    rest, _, digest = image.partition("@")
    if digest and not DIGEST_RE.match(digest):
        raise RegistryError(f"image {image!r}: {digest!r} is not a sha256 digest")
    host = ""
    first, slash, remainder = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        host, rest = first, remainder
    tag = None
    if ":" in rest.rsplit("/", 1)[-1]:
        rest, tag = rest.rsplit(":", 1)
    if not host and "/" not in rest:
        rest = f"library/{rest}"
    if registry:
        base = registry.rstrip("/")
    elif host:
        loopback = host.split(":")[0] in ("localhost", "127.0.0.1", "::1")
        base = f"{'http' if loopback else 'https'}://{host}"
    else:
        base = DOCKER_HUB
    return ImageRef(base, host, rest, tag or (None if digest else "latest"), digest or None)


def _bearer_token(challenge: str, timeout: float) -> str:
    fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = fields.pop("realm", None)
    if not realm:
        raise RegistryError(f"the registry asked for a token without saying where: {challenge!r}")
    resp = http.get(realm, params=fields, timeout=timeout)
    if resp.status != 200:
        raise RegistryError(f"token request to {realm} answered HTTP {resp.status}")
    body = resp.json()
    return body.get("token") or body.get("access_token") or ""


def resolve(image: str, registry: str | None = None, timeout: float = 30.0) -> tuple[ImageRef, str]:
    """(the parsed reference, the digest its tag names now). A reference with a digest is returned as is."""
    ref = parse(image, registry)
    if ref.digest:
        return ref, ref.digest
    url = f"{ref.registry}/v2/{ref.repository}/manifests/{ref.tag}"
    headers = {"Accept": ACCEPT}
    try:
        resp = http.request("HEAD", url, headers=headers, timeout=timeout)
        if resp.status == 401 and (resp.headers.get("WWW-Authenticate") or "").lower().startswith("bearer"):
            token = _bearer_token(resp.headers["WWW-Authenticate"][len("bearer"):].strip(), timeout)
            headers["Authorization"] = f"Bearer {token}"
            resp = http.request("HEAD", url, headers=headers, timeout=timeout)
        if resp.status == 200 and not resp.headers.get("Docker-Content-Digest"):
            resp = http.get(url, headers=headers, timeout=timeout)  # digest = sha256 of the body
    except (OSError, ValueError) as exc:  # no answer, or a token answer that is not JSON
        raise RegistryError(f"could not reach the registry for {image!r} at {ref.registry}: "
                            f"{type(exc).__name__}: {exc}") from None
    if resp.status == 404:
        raise RegistryError(f"{image!r}: the registry {ref.registry} has no tag {ref.tag!r} for {ref.repository}")
    if resp.status != 200:
        raise RegistryError(f"{image!r}: the registry {ref.registry} answered HTTP {resp.status} for {url}")
    digest = resp.headers.get("Docker-Content-Digest") or f"sha256:{hashlib.sha256(resp.body).hexdigest()}"
    if not DIGEST_RE.match(digest):
        raise RegistryError(f"{image!r}: the registry returned an unexpected digest {digest!r}")
    return ref, digest
