#!/usr/bin/env bash
# What `make test` needs outside Python, installed only when missing: `make test` runs this before
# pytest, and on an equipped machine it installs nothing and prints nothing.
#
# The gallery's browser test (tests/viewer/test_gallery_browser.py) drives Debian's Chromium through its
# chromedriver; both come from apt-get, run as root or through sudo.
set -euo pipefail

PACKAGES="chromium chromium-driver"
have_browser() { command -v chromium >/dev/null && command -v chromedriver >/dev/null; }

have_browser && exit 0
echo "make test: installing $PACKAGES with apt-get (the gallery browser test drives them)" >&2
if ! command -v apt-get >/dev/null; then
    echo "make test: no apt-get here; install Chromium and chromedriver with your package manager" \
         "(both commands on PATH) and run make test again" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null; then
        echo "make test: not root and no sudo; as root run: apt-get install -y $PACKAGES" >&2
        exit 1
    fi
    SUDO=sudo
fi
# `env` inside sudo: sudo drops the caller's environment, so the variable must come after it.
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $PACKAGES
if ! have_browser; then
    echo "make test: apt-get installed $PACKAGES but chromium or chromedriver is still not on" \
         "PATH; install them so both commands are found and run make test again" >&2
    exit 1
fi
