"""Image distribution to the 3 simulated nodes: `make image-save`'s tarball against a registry on the controller.

The same image (built in the builder's store, podman's, as the demo's training image), distributed by
bench/image.yml (the image role alone) both ways, side by side:
a. tarball: scripts/image-save.sh writes it (as `make image-save`), the role sends it once to cluster.shared_dir
   (the simulated NFS) and every node loads it from there, all at once (rollout8_image_load_throttle=0);
b. registry: virtual/sim_registry.py's registry on this machine (Debian's docker-registry, TLS with the site's own
   CA, bound to the management network's gateway), the image pushed once (sim_registry.push: skopeo, a first push
   staged uncompressed, an update's few new MB gzip'd straight from the store), then the role puts the CA in each
   node's certs.d and every node pulls, in parallel.
Each first on nodes without the image (fresh), then for an update: an image that differs from the one the nodes
hold only in a small top layer (ROLLOUT8_BENCH_UPDATE_MB, default 8), each path from the state it leaves (the
nodes hold the first image loaded from the tarball, or pulled from the registry). Time is the controller's step
(save, or push) plus the play's wall time; bytes are what the nodes received on every interface but loopback
(the controller is the only sender). Image: ROLLOUT8_BENCH_IMAGE_GB (default 1, quick 0.05) of random bytes in one
layer (nothing compresses). A failed step, or nodes with another image id than the one sent, is an error, not a
row. Needs a Docker engine, the builder, docker-registry and skopeo (no rows without them). The cluster stays,
without the images.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "virtual"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
NAME = "rollout8-bench/registry"


def _build(work: Path, tag: str, size: int, base: str | None) -> str:
    """An image of one layer of `size` random bytes on scratch, or base plus one such layer (the update), built in
    the builder's store (podman's), where the demo's training image is."""
    from sim_images import BUILDER

    ctx = work / f"ctx-{tag}"
    ctx.mkdir(parents=True, exist_ok=True)
    with open(ctx / "blob", "wb") as out:
        left = size
        while left > 0:
            out.write(os.urandom(min(left, 16 << 20)))
            left -= 16 << 20
    (ctx / "Containerfile").write_text(f"FROM {base or 'scratch'}\nCOPY blob /blob-{tag}\n")
    image = f"{NAME}:{tag}"
    proc = subprocess.run([BUILDER, "build", "-q", "-t", image, "-f", str(ctx / "Containerfile"), str(ctx)],
                          capture_output=True, text=True, timeout=1800)
    shutil.rmtree(ctx)
    if proc.returncode != 0:
        raise RuntimeError(f"{BUILDER} build {image} failed: {proc.stderr.strip()[-400:]}")
    return image


def _ids(nodes, image: str) -> dict[str, str]:
    return {n: subprocess.run(["docker", "exec", n, "docker", "image", "inspect", "-f", "{{.Id}}", image],
                              capture_output=True, text=True).stdout.strip() for n in nodes}


def _play(args: dict, log: Path, expect_id: str) -> tuple[float, int]:
    import simcluster
    from bench_image import image_play

    nodes = simcluster.NODES
    seconds, received, _ = image_play({"rollout8_image_load_throttle": 0, **args}, log)
    ids = _ids(nodes, args["rollout8_image"])
    if set(ids.values()) != {expect_id}:
        raise RuntimeError(f"the nodes hold {ids}, expected {expect_id} everywhere; log in {log}")
    return seconds, received


def _empty_daemons(*images: str) -> None:
    import simcluster

    for node in simcluster.NODES:
        subprocess.run(["docker", "exec", node, "docker", "rmi", "-f", *images], capture_output=True)


def _tarball(work: Path, image: str) -> tuple[float, Path]:
    tarball = work / f"{image.replace('/', '_').replace(':', '_')}.tar"
    start = time.monotonic()
    from sim_images import BUILDER

    subprocess.run(["bash", str(REPO / "scripts" / "image-save.sh"), image, str(tarball), BUILDER], check=True,
                   capture_output=True, timeout=3600)
    return time.monotonic() - start, tarball


def _host_id(image: str) -> str:
    from sim_images import BUILDER

    found = subprocess.run([BUILDER, "image", "inspect", "-f", "{{.Id}}", image], capture_output=True, text=True,
                           check=True).stdout.strip()
    return found if found.startswith("sha256:") else f"sha256:{found}"


def bench(work_dir: Path) -> list[dict]:
    import sim_registry
    import simcluster
    from sim_images import BUILDER

    missing = [tool for tool in ("docker", BUILDER, "skopeo", sim_registry.BINARY) if shutil.which(tool) is None]
    if missing or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        print(f"bench_registry: needs a running Docker engine, {BUILDER}, skopeo and docker-registry (missing: "
              f"{', '.join(missing) or 'the engine'}; make sysdeps): skipped")
        return []
    from bench_image import _preflight

    quick = os.environ.get("ROLLOUT8_BENCH_QUICK") == "1"
    size = int(float(os.environ.get("ROLLOUT8_BENCH_IMAGE_GB", "0.05" if quick else "1")) * 1e9)
    update = int(float(os.environ.get("ROLLOUT8_BENCH_UPDATE_MB", "8")) * 1e6)
    nodes = simcluster.NODES
    # two images, a tarball, the registry's copy and the stage, each daemon's layers and one load's unpacked copy
    simcluster.need_disk(str(work_dir), size * (5 + 2 * len(nodes)) / 1e9 + 2, "bench_registry")
    registry_dir = work_dir / "registry"
    v1 = _build(work_dir, "1", size, None)
    v2 = _build(work_dir, "2", update, v1)
    ids = {v1: _host_id(v1), v2: _host_id(v2)}
    times: dict[str, float] = {}
    sent: dict[str, int] = {}
    host = None
    try:
        simcluster.up()  # the nodes as they are (the demo's training image stays loaded): only the bench's images go
        _preflight(simcluster, work_dir)
        host, ca = sim_registry.start(sim_registry.gateway(simcluster.NETWORK), directory=registry_dir)
        # a. tarball: fresh, then the update on nodes that loaded the first
        _empty_daemons(v1, v2)
        for label, image in (("fresh", v1), ("update", v2)):
            saved, tarball = _tarball(work_dir, image)
            played, received = _play({"rollout8_image": image, "rollout8_image_tarball": str(tarball)},
                                     work_dir / f"tarball-{label}.log", ids[image])
            tarball.unlink()
            times[f"tarball {label}"], sent[f"tarball {label}"] = saved + played, received
            print(f"bench_registry: tarball {label}: save {saved:.1f} s + play {played:.1f} s, "
                  f"{received / 1e9:.3f} GB received by the nodes", flush=True)
        _empty_daemons(v1, v2)
        # b. registry: fresh (an empty registry), then the update on nodes that pulled the first
        for label, image in (("fresh", v1), ("update", v2)):
            ref = f"{host}/{image}"
            pushed, how = sim_registry.push(image, ref, ca, BUILDER, work_dir / "stage")
            digest = sim_registry.manifest_config_digest(ref, ca)
            if digest != ids[image]:
                raise RuntimeError(f"{ref}: the registry's config digest {digest} is not {image}'s id {ids[image]}")
            played, received = _play({"rollout8_image": ref, "rollout8_image_tarball": "",
                                      "rollout8_image_id": digest, "rollout8_image_registry_ca": str(ca)},
                                     work_dir / f"registry-{label}.log", digest)
            times[f"registry {label}"], sent[f"registry {label}"] = pushed + played, received
            print(f"bench_registry: registry {label}: push ({how}) {pushed:.1f} s + play {played:.1f} s, "
                  f"{received / 1e9:.3f} GB received by the nodes", flush=True)
    finally:
        sim_registry.stop(registry_dir)
        _empty_daemons(v1, v2, *((f"{host}/{v1}", f"{host}/{v2}") if host else ()))
        subprocess.run([BUILDER, "rmi", "-f", v2, v1, f"docker.io/{v2}", f"docker.io/{v1}"], capture_output=True)
    what = f"{size / 1e9:.2f} GB image, {len(nodes)} nodes"
    upd = f"{update / 1e6:.0f} MB top layer on the {size / 1e9:.2f} GB image, {len(nodes)} nodes"
    a, b = "tarball (save, shared dir, parallel loads)", "registry (push, parallel pulls)"
    return [
        {"name": f"image to fresh nodes, time ({what})", "a_label": a, "a": times["tarball fresh"],
         "b_label": b, "b": times["registry fresh"], "unit": "s",
         "note": "time is the controller's save or push plus the play; one disk and 2 cores for all"},
        {"name": f"image to fresh nodes, bytes over the controller's link ({what})", "a_label": a,
         "a": sent["tarball fresh"] / 1e9, "b_label": b, "b": sent["registry fresh"] / 1e9, "unit": "GB",
         "note": "the tarball crosses the link once (to the shared dir); a registry sends every node its own copy"},
        {"name": f"image update, time ({upd})", "a_label": a, "a": times["tarball update"],
         "b_label": b, "b": times["registry update"], "unit": "s"},
        {"name": f"image update, bytes over the controller's link ({upd})", "a_label": a,
         "a": sent["tarball update"] / 1e9, "b_label": b, "b": sent["registry update"] / 1e9, "unit": "GB",
         "note": "the registry sends only the layers a node lacks; the tarball holds every layer"},
    ]
