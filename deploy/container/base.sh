#!/bin/sh
# Print the path of the Debian bookworm minbase root llmgw's images start from (a tarball with python3, python3-venv,
# git and ca-certificates), making it first when it is missing: `debootstrap --variant=minbase` (about 35 s to
# 4 minutes, as the mirror answers), kept in $LLMGW_CACHE/container/ (default ~/.cache/llmgw) for every later build.
# Used by build.sh (the images) and tests/slurm/test_slurm_containers.py (an OCI bundle made with buildah).
# Environment: LLMGW_CACHE, DEBIAN_MIRROR (default http://deb.debian.org/debian). Needs root and debootstrap.
# Builds that start at once (the two tests above on a fresh machine, two `make image`) make it once: the first takes
# a lock beside the tarball, the others wait for it and print the same file (the same path, size and mtime, which
# build.sh's base store is named by).
set -eu

cache=${LLMGW_CACHE:-$HOME/.cache/llmgw}/container
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
include=python3,python3-venv,git,ca-certificates
base_tar=$cache/bookworm-minbase-$(echo "$include" | tr ',' '-').tar

mkdir -p "$cache"
exec 9> "$cache/.base.lock"
flock 9
if [ ! -s "$base_tar" ]; then
    command -v debootstrap > /dev/null || { echo "error: debootstrap is missing: run \`make system-packages\`" >&2; exit 1; }
    work=$(mktemp -d)
    # a debootstrap that fails midway may leave proc and sys mounted in its root: unmount them before removing it
    trap 'umount -l "$work/rootfs/proc" "$work/rootfs/sys" 2> /dev/null || :; rm -rf "$work"' EXIT
    echo "base: debootstrap --variant=minbase bookworm (once per machine; about 2 minutes) -> $base_tar" >&2
    debootstrap --variant=minbase --include="$include" bookworm "$work/rootfs" "$mirror" > "$work/debootstrap.log" 2>&1 \
        || { tail -20 "$work/debootstrap.log" >&2; echo "error: debootstrap failed (log above)" >&2; exit 1; }
    chroot "$work/rootfs" apt-get clean
    rm -rf "$work/rootfs/var/lib/apt/lists/"*
    tar --numeric-owner -C "$work/rootfs" -cf "$base_tar.part" .
    mv "$base_tar.part" "$base_tar"
fi
echo "$base_tar"
