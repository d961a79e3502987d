#!/usr/bin/env bash
# Make sure `make test-browser` has headless Chromium, and a CJK font for the glossary's Chinese.
# As root with apt-get (Debian/Ubuntu, CI), installs what is missing; elsewhere prints how to install it.
set -uo pipefail

have_chromium() {
    [ -n "${CHROMIUM:-}" ] && return 0
    command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null
}
have_cjk_font() { command -v fc-list >/dev/null && [ -n "$(fc-list :lang=zh family 2>/dev/null)" ]; }

need=()
have_chromium || need+=(chromium chromium-driver)
have_cjk_font || need+=(fonts-noto-cjk)
((${#need[@]})) || exit 0

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "test-browser: installing ${need[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null \
        || echo "test-browser: apt-get install ${need[*]} failed"
else
    echo "test-browser needs: ${need[*]}. Install it with"
    echo "    sudo apt-get update && sudo apt-get install -y ${need[*]}"
    echo "or point CHROMIUM=/path/to/chromium at any Chromium or Chrome."
fi
# Chromium is required; without a CJK font the check only notes that it could not check the glyphs.
have_chromium || { echo "test-browser: Chromium is missing"; exit 1; }
