#!/bin/sh
# Install se-exporter as a systemd service on a Debian/Ubuntu VM (also the scale-set custom script).
# Usage: install.sh <wheel URL or path>      e.g. install.sh https://example.invalid/se_exporter-0.1.0-py3-none-any.whl
set -eu
WHEEL="${1:?give the se-exporter wheel (URL or path)}"
export DEBIAN_FRONTEND=noninteractive
command -v python3 >/dev/null && python3 -c 'import venv' 2>/dev/null || { apt-get update -q && apt-get install -y -q python3-venv; }
python3 -m venv /opt/se-exporter
/opt/se-exporter/bin/pip install --quiet --upgrade "$WHEEL"
install -d -m 0755 /etc/se-exporter
[ -f /etc/se-exporter/se-exporter.env ] || install -m 0600 "$(dirname "$0")/se-exporter.env.example" /etc/se-exporter/se-exporter.env
install -m 0644 "$(dirname "$0")/se-exporter.service" /etc/systemd/system/se-exporter.service
systemctl daemon-reload
systemctl enable --now se-exporter
systemctl --no-pager status se-exporter
