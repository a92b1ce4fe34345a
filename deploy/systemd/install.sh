#!/bin/sh
# Install se-exporter as a systemd service on a Debian/Ubuntu VM (also the scale-set custom script), offline: from
# the wheelhouse `make linux-wheels` builds (dist/linux-wheels.tar.gz, or that folder unpacked), every file checked
# against the hash its requirements.txt names; no package index is contacted.
# Usage: install.sh <linux-wheels.tar.gz or folder>      e.g. install.sh ./linux-wheels.tar.gz
set -eu
WHEELS="${1:?give the wheelhouse (linux-wheels.tar.gz from make linux-wheels, or its folder)}"
export DEBIAN_FRONTEND=noninteractive
if [ -f "$WHEELS" ]; then
  unpacked="$(mktemp -d)"
  trap 'rm -rf "$unpacked"' EXIT
  tar -xzf "$WHEELS" -C "$unpacked"
  WHEELS="$(dirname "$(find "$unpacked" -name requirements.txt | head -n 1)")"
fi
[ -f "$WHEELS/requirements.txt" ] || { echo "no requirements.txt in $WHEELS: not a wheelhouse from make linux-wheels" >&2; exit 1; }
command -v python3 >/dev/null && python3 -c 'import venv' 2>/dev/null || { apt-get update -q && apt-get install -y -q python3-venv; }
python3 -m venv --clear /opt/se-exporter
/opt/se-exporter/bin/pip install --quiet --disable-pip-version-check --no-index --find-links "$WHEELS" \
  --require-hashes -r "$WHEELS/requirements.txt"
install -d -m 0755 /etc/se-exporter
[ -f /etc/se-exporter/se-exporter.env ] || install -m 0600 "$(dirname "$0")/se-exporter.env.example" /etc/se-exporter/se-exporter.env
install -m 0644 "$(dirname "$0")/se-exporter.service" /etc/systemd/system/se-exporter.service
systemctl daemon-reload
systemctl enable --now se-exporter
systemctl --no-pager status se-exporter
