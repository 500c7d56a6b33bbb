#!/usr/bin/env bash
# Install the system tools setup needs (Java 17+, Maven, Python 3.11 venv, PostgreSQL's server)
# when they are missing.
# Idempotent: prints nothing and installs nothing when everything is there.
set -euo pipefail
need=()
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need+=(maven)
# the local Hive Metastore's database (`deltaferry stack up --catalog`)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)
command -v python3.11 >/dev/null 2>&1 || command -v python3 >/dev/null 2>&1 || need+=(python3 python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing system packages: ${need[*]}" >&2
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
java_major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
if [ "${java_major:-0}" -lt 17 ]; then
  echo "setup: Java ${java_major:-?} found; Spark 4.2 and Kafka 4.3 need Java 17 or newer (set JAVA_HOME)" >&2
  exit 1
fi
