"""The simulated site's image registry: Debian's `docker-registry` (the CNCF distribution registry) on the controller.

What this module owns: the registry process on this machine (the controller), bound to the address the nodes reach
the controller on (the management network's gateway: every node has that subnet on its management NIC, the node
without a default route included), its config and storage under .cache/registry, and the site's own certificate
authority there (a CA key and certificate made once, a server certificate for the address it listens on), whose
certificate the image role puts in each node's /etc/docker/certs.d/<host:port>/ca.crt (Docker reads it at every
pull: no daemon restart, no insecure-registries entry). Pushing an image there (`push`: skopeo from the builder's
store, its layers uncompressed or gzip'd) and the distribution path the demo takes (`choose_path`). Nothing here
reaches beyond this machine and the simulated site's containers: the registry is the site's, air-gapped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from sim_images import REPO, sh

REGISTRY_DIR = REPO / ".cache" / "registry"
PORT = int(os.environ.get("ROLLOUT8_SIM_REGISTRY_PORT", "5443"))
BINARY = "docker-registry"  # Debian's package of the same name (make sysdeps)
# The demo's distribution path (ROLLOUT8_SIM_IMAGE_PATH): "tarball" (make image-save, the shared directory, docker
# load), "registry" (pushed once to the controller's registry, pulled by every node), or "auto" (choose_path).
PATHS = ("auto", "tarball", "registry")


def config_yaml(address: str, port: int, storage: Path, cert: Path, key: Path) -> str:
    """The registry's config: filesystem storage under storage, TLS with the site CA's server certificate, bound to
    address:port only (never 0.0.0.0), deletes allowed (the demo drops superseded images), no auth (the site's
    management network only, as the nodes' Docker daemons reach it), its debug server off."""
    return json.dumps({
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True},
                    "cache": {"blobdescriptor": "inmemory"}},
        "http": {"addr": f"{address}:{port}", "tls": {"certificate": str(cert), "key": str(key)},
                 "headers": {"X-Content-Type-Options": ["nosniff"]}},
        "health": {"storagedriver": {"enabled": False}},
    }, indent=2) + "\n"  # JSON is YAML: the registry reads it as its config


def server_cert_ext(address: str) -> str:
    """The openssl extensions of the registry's server certificate: for the IP address it listens on (Docker checks
    the address it dials against the certificate's IP SANs), for serving TLS only."""
    return ("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage=serverAuth\nsubjectAltName=IP:{address}\n")


def choose_path(requested: str, nodes_hold_earlier: bool) -> str:
    """The demo's distribution path. "tarball" or "registry" as asked; "auto": the registry where the nodes hold an
    earlier version of the image (an update: only the layers that changed cross the link once the nodes have pulled
    from it, and a first pull is no slower than a load: docs/benchmarks.md), the tarball where they hold none (a
    fresh node needs every layer either way: the same time here, the tarball crosses the link once instead of once
    per node, and the controller's disk holds no registry copy beside the builder's)."""
    if requested not in PATHS:
        raise ValueError(f"ROLLOUT8_SIM_IMAGE_PATH={requested!r}: one of {', '.join(PATHS)}")
    if requested != "auto":
        return requested
    return "registry" if nodes_hold_earlier else "tarball"


def gateway(network: str) -> str:
    """The address this machine has on a Docker network: where the nodes reach the controller."""
    out = sh("docker", "network", "inspect", "-f", "{{(index .IPAM.Config 0).Gateway}}", network,
             capture=True).stdout.strip()
    if not out:
        raise SystemExit(f"the Docker network {network} has no gateway: `make demo-down`, then again")
    return out


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"openssl {args[0]} failed: {proc.stderr.strip()[-400:]}")


def certificates(address: str, directory: Path = REGISTRY_DIR) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key): the site's CA made once, the server's made again when the
    address it is for changes (a new Docker network may get another gateway)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_crt = directory / "ca.key", directory / "ca.crt"
    if not (ca_key.is_file() and ca_crt.is_file()):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", str(ca_key), "-out", str(ca_crt), "-days", "3650",
                 "-subj", "/CN=rollout8 simulated site CA")
    key, crt, made_for = directory / "server.key", directory / "server.crt", directory / "server.address"
    if not (key.is_file() and crt.is_file() and made_for.is_file() and made_for.read_text() == address):
        ext = directory / "server.ext"
        ext.write_text(server_cert_ext(address))
        csr = directory / "server.csr"
        _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={address}")
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key), "-CAcreateserial",
                 "-out", str(crt), "-days", "825", "-extfile", str(ext))
        made_for.write_text(address)
    return ca_crt, crt, key


def _pid(directory: Path) -> int | None:
    try:
        pid = int((directory / "registry.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if Path(f"/proc/{pid}").exists() else []
    return pid if cmdline and Path(cmdline[0].decode()).name == BINARY else None  # not a reused pid


def answers(address: str, port: int, ca: Path, timeout: float = 3) -> bool:
    """Whether the registry answers its API's base endpoint over TLS, its certificate checked against the CA."""
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(f"https://{address}:{port}/v2/", timeout=timeout, context=context) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError):
        return False


def start(address: str, port: int = PORT, directory: Path = REGISTRY_DIR, attempts: int = 40) -> tuple[str, Path]:
    """The registry serving on address:port (idempotent: a running one of the same config is kept). Returns
    (host:port, the CA certificate the nodes must trust)."""
    ca, crt, key = certificates(address, directory)
    config = directory / "config.yml"
    text = config_yaml(address, port, directory / "storage", crt, key)
    pid = _pid(directory)
    if pid and config.is_file() and config.read_text() == text and answers(address, port, ca):
        return f"{address}:{port}", ca
    if pid:
        stop(directory)
    config.write_text(text)
    log = (directory / "registry.log").open("ab")
    proc = subprocess.Popen([BINARY, "serve", str(config)], stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                            start_new_session=True)  # outlives this process, as the site's service would
    (directory / "registry.pid").write_text(str(proc.pid))
    for _ in range(attempts):
        if answers(address, port, ca, timeout=1):
            print(f">> registry {address}:{port} (pid {proc.pid}, storage {directory / 'storage'})", file=sys.stderr)
            return f"{address}:{port}", ca
        if proc.poll() is not None:
            break
        time.sleep(0.25)
    tail = (directory / "registry.log").read_text(errors="replace")[-600:]
    stop(directory)
    raise SystemExit(f"{BINARY} did not answer on https://{address}:{port}/v2/ (log {directory / 'registry.log'}): "
                     f"{tail}")


def stop(directory: Path = REGISTRY_DIR) -> None:
    """The registry this module started, stopped (its pid file's process only, and only if it is the registry)."""
    pid = _pid(directory)
    if pid:
        os.kill(pid, signal.SIGTERM)
        for _ in range(40):
            if _pid(directory) is None:
                break
            time.sleep(0.25)
    (directory / "registry.pid").unlink(missing_ok=True)


# Below this many bytes of layers the registry lacks, a push compresses them straight from the store (gzip -1 of a
# few MB costs nothing); above, it stages them uncompressed (gzip -1 of GBs on 2 cores: minutes).
DIRECT_PUSH_MAX_BYTES = 256 * 2**20


def push_mode(layers: list[tuple[str, int]], present: set[str], limit: int = DIRECT_PUSH_MAX_BYTES) -> str:
    """"direct" (skopeo straight from the store, the missing layers gzip'd at level 1) when the registry lacks at
    most limit bytes of the image's layers (digest, size), "staged" (uncompressed through a dir: copy) otherwise."""
    missing = sum(size for digest, size in layers if digest not in present)
    return "direct" if missing <= limit else "staged"


def _source(source: str, engine: str) -> str:
    if Path(engine).name != "podman":
        return f"docker-daemon:{source}"
    if "/" in source and not any(c in source.split("/")[0] for c in ".:"):
        source = f"localhost/{source}"  # podman's name of a local image
    return f"containers-storage:{source}"


def _context(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


def present_blobs(ref: str, digests: list[str], ca: Path) -> set[str]:
    """Which of digests the registry holds in ref's repository (HEAD on each blob)."""
    host, _, rest = ref.partition("/")
    name = rest.rsplit(":", 1)[0]
    found = set()
    for digest in digests:
        req = urllib.request.Request(f"https://{host}/v2/{name}/blobs/{digest}", method="HEAD")
        try:
            with urllib.request.urlopen(req, timeout=30, context=_context(ca)) as resp:
                if resp.status == 200:
                    found.add(digest)
        except urllib.error.HTTPError as err:
            if err.code != 404:
                raise
    return found


def push(source: str, ref: str, ca: Path, engine: str, stage: Path, timeout: int = 3600) -> tuple[float, str]:
    """source (an image in engine's store: podman's or docker's) pushed to ref (registry/name:tag) by skopeo, trusting
    the site CA. Returns (seconds, how: push_mode's). Layers the registry holds already are not sent.

    `podman push` (and skopeo straight from the store) always compress the layers for a registry, and skopeo's
    --preserve-digests refuses a store's image ("would require changing layer representation"). So an image whose
    layers the registry mostly lacks (a first push) is staged as a `dir:` copy (uncompressed, the store's manifest
    and config: Docker gives it the same id), pushed from there with --preserve-digests and the copy removed: no
    gzip of GBs on the controller's cores and none to undo on the nodes'. An update (the registry holds all but a
    few MB) goes straight from the store, its new layers gzip'd at level 1: nothing staged."""
    certs = ca.parent / "skopeo-certs"  # skopeo's --dest-cert-dir reads *.crt as CAs
    certs.mkdir(exist_ok=True)
    (certs / "ca.crt").write_bytes(ca.read_bytes())
    src = _source(source, engine)
    dest = ["--dest-cert-dir", str(certs), f"docker://{ref}"]
    start_t = time.monotonic()
    raw = subprocess.run(["skopeo", "inspect", "--raw", src], capture_output=True, text=True, timeout=600)
    if raw.returncode != 0:
        raise RuntimeError(f"skopeo inspect {src} failed: {raw.stderr.strip()[-400:]}")
    layers = [(layer["digest"], int(layer.get("size", 0))) for layer in json.loads(raw.stdout)["layers"]]
    how = push_mode(layers, present_blobs(ref, [d for d, _ in layers], ca))
    steps = [["--dest-compress-format", "gzip", "--dest-compress-level", "1", src, *dest]]
    if how == "staged":
        shutil.rmtree(stage, ignore_errors=True)
        stage.parent.mkdir(parents=True, exist_ok=True)
        steps = [[src, f"dir:{stage}"], ["--preserve-digests", f"dir:{stage}", *dest]]
    try:
        for step in steps:
            proc = subprocess.run(["skopeo", "copy", "-q", *step], capture_output=True, text=True, timeout=timeout)
            if proc.returncode != 0:
                raise RuntimeError(f"skopeo copy {' '.join(step[-2:])} failed: {proc.stderr.strip()[-600:]}")
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return time.monotonic() - start_t, how


def manifest_config_digest(ref: str, ca: Path) -> str:
    """The config digest of ref's manifest in the registry: the image id Docker gives it once pulled."""
    host, _, rest = ref.partition("/")
    name, _, tag = rest.rpartition(":")
    req = urllib.request.Request(f"https://{host}/v2/{name}/manifests/{tag}", headers={"Accept": ", ".join((
        "application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"))})
    with urllib.request.urlopen(req, timeout=30, context=_context(ca)) as resp:
        return json.loads(resp.read())["config"]["digest"]


def _digest_of(host: str, name: str, tag: str, ca: Path) -> str | None:
    req = urllib.request.Request(f"https://{host}/v2/{name}/manifests/{tag}", method="HEAD", headers={
        "Accept": "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"})
    with urllib.request.urlopen(req, timeout=30, context=_context(ca)) as resp:
        return resp.headers.get("Docker-Content-Digest")


def prune(ref: str, ca: Path, directory: Path = REGISTRY_DIR) -> list[str]:
    """Every other tag of ref's repository deleted from the registry and its blobs no manifest uses any more
    collected (docker-registry garbage-collect, the registry stopped meanwhile, then started again): the demo's
    superseded training images would otherwise stay on this machine's disk for good (GBs each when the stack
    changed). Returns the tags removed."""
    host, _, rest = ref.partition("/")
    name, _, keep = rest.rpartition(":")
    with urllib.request.urlopen(f"https://{host}/v2/{name}/tags/list", timeout=30, context=_context(ca)) as resp:
        tags = json.loads(resp.read()).get("tags") or []
    keep_digest = _digest_of(host, name, keep, ca)
    removed = []
    for tag in tags:
        if tag == keep:
            continue
        digest = _digest_of(host, name, tag, ca)
        if digest and digest != keep_digest:
            req = urllib.request.Request(f"https://{host}/v2/{name}/manifests/{digest}", method="DELETE")
            with urllib.request.urlopen(req, timeout=30, context=_context(ca)):
                removed.append(tag)
    if removed:
        address, _, port = host.rpartition(":")
        stop(directory)
        gc = subprocess.run([BINARY, "garbage-collect", "--delete-untagged", str(directory / "config.yml")],
                            capture_output=True, text=True, timeout=1800)
        start(address, int(port), directory)
        if gc.returncode != 0:
            raise RuntimeError(f"{BINARY} garbage-collect failed: {gc.stderr.strip()[-400:]}")
    return removed
