#!/bin/sh
# A stand-in for the Python base image, made from Debian's archive alone: for sites that
# cannot pull docker.io/library/python (air-gapped, or no container registry at all).
#   deploy/image/debian-base.sh NAME [MIRROR...]
# makes the local image NAME (e.g. localhost/healthd-base:bookworm) with Debian 12's
# python3 (3.11), venv and CA certificates, then build healthd on it:
#   podman build --build-arg PYTHON_IMAGE=NAME --target slim -f Containerfile .
# MIRROR: your Debian mirror (default: Debian's own, with its updates and security
# suites; a file holding apt sources works too). Needs root, mmdebstrap and podman
# (Debian packages). SOURCE_DATE_EPOCH, when set, stamps the files' times.
set -eu
if [ $# -lt 1 ]; then
  echo "usage: $0 NAME [MIRROR...]" >&2
  exit 64
fi
name=$1
shift
# /usr merged by directory links, as debootstrap and Debian's own images do it (the
# usrmerge package would bring Perl, 50 MB, for that alone).
merged_usr=/usr/share/mmdebstrap/hooks/merged-usr
hooks=
if [ -d "$merged_usr" ]; then hooks="--hook-dir=$merged_usr"; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# As Debian's own -slim images: no manual pages, documentation (but the copyrights) or
# translations.
# shellcheck disable=SC2086 # $hooks: one option or none
mmdebstrap --quiet --variant=minbase --mode=root --format=tar $hooks \
  --include=python3,python3-venv,python-is-python3,ca-certificates \
  --aptopt='Acquire::Retries "3"' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
  bookworm "$work/rootfs.tar" "$@"
podman import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  "$work/rootfs.tar" "$name" >/dev/null
echo "$name"
