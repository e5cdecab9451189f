#!/usr/bin/env bash
# Build target/gantry_<version>_<arch>.deb: the `gantry` CLI and engine, the desktop app with its menu
# entry and icon, the systemd unit, the default lab config, shell completions and the man page.
#   scripts/package.sh            release build (what a lab installs)
#   scripts/package.sh --debug    package the debug binaries already built (CI: saves a second build)
# GANTRY_DEB_VERSION overrides the version (CI builds a second package to test upgrades).
# Then: dpkg -i target/gantry_*.deb   (see the guide, docs/book/src/admin-install.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=release
[ "${1:-}" = --debug ] && PROFILE=debug
scripts/setup-ci-deps.sh build-essential pkg-config dpkg-dev file libwebkit2gtk-4.1-dev libxdo-dev \
  libayatana-appindicator3-dev librsvg2-dev
VERSION="${GANTRY_DEB_VERSION:-$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)}"
ARCH="$(dpkg --print-architecture)"
if [ "$PROFILE" = release ]; then
  [ -d ui/node_modules ] || npm --prefix ui ci --no-audit --no-fund
  npm --prefix ui run build
  cargo build --release --locked -p gantry -p gantry-app
fi
BIN="target/$PROFILE"
for b in gantry gantry-app; do
  [ -x "$BIN/$b" ] || { echo "package.sh: $BIN/$b is missing: build it first (cargo build -p ${b/gantry-app/gantry-app})" >&2; exit 1; }
done

ROOT="target/deb/gantry_${VERSION}_${ARCH}"
rm -rf "$ROOT"
# Stripped: debug info is most of a binary's size (a debug build shrinks from ~540 MB to ~60 MB).
install -Dm755 -s "$BIN/gantry" "$ROOT/usr/bin/gantry"
install -Dm755 -s "$BIN/gantry-app" "$ROOT/usr/bin/gantry-app"
install -Dm644 packaging/gantry.service "$ROOT/lib/systemd/system/gantry.service"
install -Dm644 packaging/config.toml "$ROOT/etc/gantry/config.toml"
install -d "$ROOT/etc/gantry/templates"
install -Dm644 packaging/gantry.desktop "$ROOT/usr/share/applications/gantry.desktop"
install -Dm644 icons/32x32.png "$ROOT/usr/share/icons/hicolor/32x32/apps/gantry.png"
install -Dm644 icons/128x128.png "$ROOT/usr/share/icons/hicolor/128x128/apps/gantry.png"
install -Dm644 icons/128x128@2x.png "$ROOT/usr/share/icons/hicolor/256x256/apps/gantry.png"
install -Dm644 packaging/grafana-dashboard.json "$ROOT/usr/share/gantry/grafana-dashboard.json"
GEN="$(mktemp -d)"; trap 'rm -rf "$GEN"' EXIT
"$BIN/gantry" generate "$GEN" >/dev/null
install -Dm644 "$GEN/gantry.bash" "$ROOT/usr/share/bash-completion/completions/gantry"
install -Dm644 "$GEN/_gantry" "$ROOT/usr/share/zsh/vendor-completions/_gantry"
install -Dm644 "$GEN/gantry.fish" "$ROOT/usr/share/fish/vendor_completions.d/gantry.fish"
install -d "$ROOT/usr/share/man/man1"
gzip -9n < "$GEN/gantry.1" > "$ROOT/usr/share/man/man1/gantry.1.gz"
install -Dm644 LICENSE "$ROOT/usr/share/doc/gantry/copyright"

# Library dependencies from the binaries themselves (dpkg-shlibdeps needs a debian/control to run in).
SHL="$(mktemp -d)"; mkdir -p "$SHL/debian"; printf 'Source: gantry\n\nPackage: gantry\nArchitecture: any\n' > "$SHL/debian/control"
DEPS="$(cd "$SHL" && dpkg-shlibdeps -O "$OLDPWD/$ROOT/usr/bin/gantry" "$OLDPWD/$ROOT/usr/bin/gantry-app" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')"
rm -rf "$SHL"

install -d "$ROOT/DEBIAN"
install -m755 packaging/debian/postinst packaging/debian/prerm packaging/debian/postrm "$ROOT/DEBIAN/"
echo /etc/gantry/config.toml > "$ROOT/DEBIAN/conffiles"
cat > "$ROOT/DEBIAN/control" <<CONTROL
Package: gantry
Version: $VERSION
Architecture: $ARCH
Maintainer: Gantry developers <gantry@localhost>
Section: science
Priority: optional
Depends: $DEPS, adduser
Recommends: docker.io | docker-ce
Installed-Size: $(du -sk "$ROOT" | cut -f1)
Description: fair, self-service GPU job queue for a shared workstation
 Gantry runs researchers' GPU jobs in Docker containers on the GPUs that are
 free, packs small jobs onto shared GPUs, keeps a persistent queue and the
 history of runs, and shows live GPU charts, the queue and logs in a desktop
 app. One engine (gantry.service) serves every local user.
CONTROL
OUT="target/gantry_${VERSION}_${ARCH}.deb"
dpkg-deb --root-owner-group -Zxz -z1 --build "$ROOT" "$OUT" >/dev/null
echo "$OUT"
