#!/usr/bin/env bash
# Build the guide (docs/book, mdBook) into docs/book/book and check its links; fails on a broken book.
# Installs mdbook from crates.io the first time (pinned; a few minutes of compiling, timed below).
set -euo pipefail
cd "$(dirname "$0")/.."
MDBOOK_VERSION=0.5.4
export PATH="$HOME/.cargo/bin:$PATH"
if ! mdbook --version 2>/dev/null | grep -qx "mdbook v$MDBOOK_VERSION"; then
  echo "==> installing mdbook $MDBOOK_VERSION from crates.io (no server or watcher: build only)"
  start=$(date +%s)
  cargo install mdbook --locked --version "$MDBOOK_VERSION" --no-default-features --features search
  echo "==> mdbook installed in $(( $(date +%s) - start )) s"
fi
# Relative links and #anchors of the book and the front pages (why not mdbook-linkcheck: see the script).
python3 scripts/check-links.py
# create-missing = false in book.toml: a page SUMMARY.md names but that is missing fails here.
mdbook build docs/book
echo "==> the guide: docs/book/book/index.html"
