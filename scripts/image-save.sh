#!/usr/bin/env bash
# Write IMAGE as the tarball the image role loads on air-gapped nodes (`make image-save`):
#   scripts/image-save.sh IMAGE OUT [ENGINE]     OUT ending .tar.gz: gzip -1; .tar: as saved
# prints the image id (for the inventory: rollout8_image_id) and the tarball's sha256 (for `sha256sum -c`);
# beside it OUT.sha256 (for `sha256sum -c`) and OUT.json: the image's reference, id, architecture and size, which the
# image role reads on the controller to refuse an image of another architecture before copying GBs to any node.
# Written to .part files and renamed, so a killed run leaves no tarball that looks complete.
set -euo pipefail
image=${1:?usage: image-save.sh IMAGE OUT [ENGINE]}
out=${2:?usage: image-save.sh IMAGE OUT [ENGINE]}
engine=${3:-docker}
meta=$("$engine" image inspect -f '{"image": "'"$image"'", "id": "{{.Id}}", "architecture": "{{.Architecture}}", "os": "{{.Os}}", "size": {{.Size}}}' "$image") \
  || { echo "image-save: no image $image here: build it first (make image)" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
trap 'rm -f "$out.part" "$out.json.part"' EXIT
# podman names a local image localhost/NAME, and saves it so: docker would load it under that name, which is not
# rollout8_image. Saved as docker.io/NAME, docker loads it as NAME.
ref=$image
if [ "$(basename "$engine")" = podman ] && [[ ${image%%/*} != *[.:]* && ${image%%/*} != localhost ]]; then
  ref=docker.io/$image
  "$engine" tag "$image" "$ref"
fi
case $out in
  *.tar.gz) "$engine" save "$ref" | gzip -1 >"$out.part" ;;
  *.tar) "$engine" save -o "$out.part" "$ref" ;;
  *) echo "image-save: $out: name it .tar or .tar.gz" >&2; exit 1 ;;
esac
echo "$meta" >"$out.json.part"
mv "$out.part" "$out"
mv "$out.json.part" "$out.json"
(cd "$(dirname "$out")" && sha256sum "$(basename "$out")" >"$(basename "$out").sha256")
echo ">> $out: $meta" >&2
# The image id for the inventory and the tarball's sha256 (ansible/inventory/sample/group_vars/all/runtime.yml says
# where each goes), on stdout.
id=$("$engine" image inspect -f '{{.Id}}' "$image")
[[ $id == sha256:* ]] || id=sha256:$id
echo "image id: $id"
echo "tarball sha256: $(cut -d' ' -f1 "$out.sha256")  $out"
echo "on each node: sha256sum -c $(basename "$out").sha256 && docker load -i $(basename "$out")  (or the image role)" >&2
