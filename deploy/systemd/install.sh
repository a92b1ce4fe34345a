#!/bin/sh
# Install, upgrade or uninstall se-exporter as a systemd service on a Debian/Ubuntu VM (also the scale-set custom
# script), offline: from the wheelhouse `make linux-wheels` builds (dist/linux-wheels.tar.gz), no package index is
# contacted. Guide: docs/install.md.
#
#   install.sh --sha256 HASH linux-wheels.tar.gz    install, or upgrade in place (the same command)
#   install.sh --uninstall [--purge]                 remove the service and the program; --purge also the settings
#                                                    (/etc/se-exporter) and the state (/var/lib/se-exporter)
#
# HASH is the first word of the `sha256sum` line `make linux-wheels` prints, published apart from the archive: an
# archive with any other hash is refused before anything is changed; pip then checks every wheel against the hash
# its requirements.txt names. Each wheelhouse gets a virtualenv of its own, /opt/se-exporter/releases/<version>-<hash
# prefix>; /opt/se-exporter/current points at the one the service runs. An upgrade builds the new one beside the
# running one, switches the link, restarts the service and waits for /healthz: if the new one does not answer, the
# link goes back, the old one is restarted and the script fails. The running virtualenv is never touched before
# the new one answers. Each release keeps the unit file it was installed with, and /opt/se-exporter/verified points
# at the last release that answered: a run killed while it waits (an extension's timeout, a reboot) is finished by
# the next one, which verifies the new release again or goes back to the verified one with its own unit file.
# INSTALL_ROOT (default empty) prefixes every path written, for tests; HEALTH_TIMEOUT is /healthz's wait in seconds.
set -eu
ROOT="${INSTALL_ROOT:-}"
PREFIX="$ROOT/opt/se-exporter"
ETC="$ROOT/etc/se-exporter"
UNIT="$ROOT/etc/systemd/system/se-exporter.service"
STATE="$ROOT/var/lib/se-exporter"
HERE="$(cd "$(dirname "$0")" && pwd)"
HEALTH_TIMEOUT="${HEALTH_TIMEOUT:-60}"

fail() { echo "install.sh: $*" >&2; exit 1; }
usage() { fail "usage: install.sh --sha256 HASH linux-wheels.tar.gz | install.sh --uninstall [--purge]"; }

uninstall() {
  if [ -f "$UNIT" ]; then
    systemctl disable --now se-exporter || fail "systemctl could not stop se-exporter; nothing was removed"
    rm -f "$UNIT"
    systemctl daemon-reload
  fi
  rm -rf "$PREFIX"
  if [ "$1" = purge ]; then
    # DynamicUser keeps the state in /var/lib/private/se-exporter behind the /var/lib/se-exporter link.
    rm -rf "$ETC" "$STATE" "$ROOT/var/lib/private/se-exporter"
    echo "se-exporter removed, with its settings and state"
  else
    echo "se-exporter removed; kept $ETC (settings) and $STATE (state): --purge removes them"
  fi
}

# SE_EXPORTER_LISTEN from the settings file, as the service reads it (":10169", "10.0.0.4:10169", "[::]:10169").
listen() {
  value="$(sed -n 's/^[[:space:]]*SE_EXPORTER_LISTEN=//p' "$ETC/se-exporter.env" 2>/dev/null | tail -n 1)"
  value="${value%\"}"; value="${value#\"}"
  echo "$value"
}

# True once the running service answers 200 on /healthz, within HEALTH_TIMEOUT seconds. It is asked where it listens:
# a service bound to the VM's private address (as docs/install.md advises) does not answer on 127.0.0.1; one bound
# to every address (empty host, 0.0.0.0, [::]) is asked on loopback.
healthy() {
  "$1/bin/python" - "$(listen)" "$HEALTH_TIMEOUT" <<'EOF'
import re, sys, time, urllib.request
found = re.fullmatch(r"(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:\[\]]*)):(?P<port>[0-9]{1,5})", sys.argv[1].strip())
host, port = (found["v6"] or found["host"] or "", found["port"]) if found else ("", "10169")
host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
url = f"http://{f'[{host}]' if ':' in host else host}:{port}/healthz"
deadline = time.monotonic() + float(sys.argv[2])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
while time.monotonic() < deadline:
    try:
        with opener.open(url, timeout=2) as answer:
            if answer.status == 200:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.5)
sys.exit(1)
EOF
}

link() {  # atomically: a new link $1 to release $2, renamed over the old one
  ln -sfn "releases/$2" "$PREFIX/$1.new"
  mv -T "$PREFIX/$1.new" "$PREFIX/$1"
}

switch() {  # the service onto release $1, with the unit file that release was installed with
  install -m 0644 "$PREFIX/releases/$1/se-exporter.service" "$UNIT"
  systemctl daemon-reload
  link current "$1"
}

SHA=""
ACTION=install
PURGE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --sha256) [ $# -ge 2 ] || usage; SHA="$2"; shift 2 ;;
    --sha256=*) SHA="${1#*=}"; shift ;;
    --uninstall) ACTION=uninstall; shift ;;
    --purge) PURGE=purge; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) usage ;;
    *) [ -z "${WHEELS:-}" ] || usage; WHEELS="$1"; shift ;;
  esac
done
if [ "$ACTION" = uninstall ]; then uninstall "$PURGE"; exit 0; fi
[ -n "${WHEELS:-}" ] || usage
[ -f "$WHEELS" ] || fail "$WHEELS is not a file: give linux-wheels.tar.gz from make linux-wheels"
echo "$SHA" | grep -Eqx '[0-9a-fA-F]{64}' \
  || fail "give the archive's sha256 with --sha256 (the sha256sum line make linux-wheels prints)"
command -v python3 >/dev/null || fail "no python3 on PATH (Debian/Ubuntu: apt-get install python3 python3-venv)"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' || fail "python3 is older than 3.10, which se-exporter needs"
python3 -c 'import ensurepip' 2>/dev/null \
  || fail "python3 cannot create virtualenvs (no ensurepip): apt-get install python3-venv, then run this again"

actual="$(sha256sum "$WHEELS" | cut -d ' ' -f 1)"
SHA="$(echo "$SHA" | tr 'A-F' 'a-f')"
[ "$actual" = "$SHA" ] || fail "$WHEELS has sha256 $actual, not the $SHA given: refused, nothing changed"
# One install at a time (cloud-init's first boot and a Custom Script upgrade may meet): the second one stops here.
install -d -m 0755 "$PREFIX"
exec 9>>"$PREFIX/.lock"
flock -n 9 || fail "another install.sh is running on this machine (it holds $PREFIX/.lock); nothing changed"
unpacked="$(mktemp -d)"
trap 'rm -rf "$unpacked"' EXIT
tar -xzf "$WHEELS" -C "$unpacked"
HOUSE="$(dirname "$(find "$unpacked" -name requirements.txt | head -n 1)")"
[ -f "$HOUSE/requirements.txt" ] || fail "no requirements.txt in $WHEELS: not a wheelhouse from make linux-wheels"
# The wheelhouse holds compiled wheels for some CPython versions only (make linux-wheels: 3.10-3.12): a python3 it
# has no wheels for made pip fail with a message that named neither. Read the versions from the wheels' tags.
need="$(python3 - "$HOUSE" <<'EOF'
import re, sys
from pathlib import Path
held = {}
for wheel in Path(sys.argv[1]).glob("*.whl"):
    name, *_, python, abi, _platform = wheel.name[:-len(".whl")].split("-")
    for tag in python.split("."):
        found = re.fullmatch(r"cp3([0-9]+)", tag)
        if found and abi != "abi3":
            held.setdefault(name.lower(), set()).add(int(found[1]))
versions = sorted(set.intersection(*held.values())) if held else []
if held and sys.version_info[1] not in versions:
    print(", ".join(f"3.{minor}" for minor in versions) or "none")
EOF
)" || fail "python3 could not read the wheelhouse's wheel names"
[ -z "$need" ] || fail "python3 is $(python3 -c 'import platform; print(platform.python_version())'), but this wheelhouse holds wheels for CPython $need only: run install.sh with one of those first on PATH as python3; nothing installed"
version="$(basename "$(find "$HOUSE" -name 'se_exporter-*.whl' | head -n 1)" | cut -d - -f 2)"
[ -n "$version" ] || fail "no se-exporter wheel in $WHEELS"
release="$version-$(echo "$SHA" | cut -c 1-12)"
# The release to go back to: the last one that answered /healthz (not "current", which an interrupted upgrade left
# on a release never verified).
old="$(basename "$(readlink "$PREFIX/verified" 2>/dev/null || true)")"
[ -z "$old" ] || [ -f "$PREFIX/releases/$old/.built" ] || old=""

install -d -m 0755 "$PREFIX/releases" "$ETC" "$(dirname "$UNIT")"
if [ ! -f "$PREFIX/releases/$release/.built" ]; then
  rm -rf "$PREFIX/releases/$release"  # an earlier attempt killed while it built: never run, never verified
  python3 -m venv "$PREFIX/releases/$release"
  "$PREFIX/releases/$release/bin/pip" install --quiet --disable-pip-version-check --no-index --find-links "$HOUSE" \
    --require-hashes -r "$HOUSE/requirements.txt" || { rm -rf "$PREFIX/releases/$release"; fail "pip refused the wheelhouse; nothing changed"; }
  "$PREFIX/releases/$release/bin/se-exporter" --help >/dev/null \
    || { rm -rf "$PREFIX/releases/$release"; fail "the new se-exporter does not start; nothing changed"; }
  install -m 0644 "$HERE/se-exporter.service" "$PREFIX/releases/$release/se-exporter.service"
  touch "$PREFIX/releases/$release/.built"
fi
[ -f "$ETC/se-exporter.env" ] || install -m 0600 "$HERE/se-exporter.env.example" "$ETC/se-exporter.env"
switch "$release"
systemctl enable se-exporter
systemctl restart se-exporter
if healthy "$PREFIX/current"; then
  link verified "$release"
  for stale in "$PREFIX"/releases/*; do
    [ "$(basename "$stale")" = "$release" ] || rm -rf "$stale"
  done
  [ "$old" = "$release" ] && old=""
  echo "se-exporter $version is running (${old:+upgraded from $old; }$PREFIX/releases/$release)"
  exit 0
fi
if [ -n "$old" ] && [ "$old" != "$release" ]; then
  switch "$old"
  systemctl restart se-exporter
  rm -rf "$PREFIX/releases/$release"
  healthy "$PREFIX/current" && fail "se-exporter $version did not answer /healthz within $HEALTH_TIMEOUT s: rolled back to $old, which is running (journalctl -u se-exporter says why)"
  fail "se-exporter $version did not answer /healthz within $HEALTH_TIMEOUT s; rolled back to $old, which does not answer either (journalctl -u se-exporter)"
fi
fail "se-exporter $version did not answer /healthz within $HEALTH_TIMEOUT s (journalctl -u se-exporter says why)"
