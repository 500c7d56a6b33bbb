#!/usr/bin/env bash
# Install Debian's chromium and chromium-driver when missing: the UI's browser tests
# (tests/integration/test_ui.py) drive them through selenium. Idempotent: prints nothing and
# installs nothing when both are there.
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing system packages: ${need[*]}" >&2
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
