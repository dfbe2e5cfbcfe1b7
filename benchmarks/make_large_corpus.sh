#!/usr/bin/env bash
# Builds a >= 5 GB corpus of mostly distinct source code and documentation from Debian packages, for
# measuring how SuperBPE's stage 2 grows with the distinct text it must hold (BENCHMARKS.md).
#
#   usage: benchmarks/make_large_corpus.sh [OUT_DIR]    (default: ${TMPDIR:-/tmp}/superbpe-corpora/large)
#
# Output: OUT_DIR/large.txt (every UTF-8 text file of each package, in sorted path order, each followed by
# "\n<|endoftext|>\n"), OUT_DIR/MANIFEST (package versions, bytes per part, sha256 of large.txt) and
# OUT_DIR/READY once complete. Each package's text is cached as OUT_DIR/parts/<package>.txt, so a re-run skips
# what exists; delete a part to rebuild it. Needs apt (Debian bookworm lists) and ~12 GB of free disk while building.
#
# Deterministic: the package versions are pinned below. When the archive no longer serves a pinned version, the
# current one is used and MANIFEST says so (the text then differs slightly; sizes and growth barely change).
set -euo pipefail
usage="usage: benchmarks/make_large_corpus.sh [OUT_DIR]    (default: \${TMPDIR:-/tmp}/superbpe-corpora/large)"
case "${1:-}" in
  -h|--help) echo "$usage"; exit 0 ;;
  -*) echo "make_large_corpus.sh: unknown option $1; $usage" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "make_large_corpus.sh: one OUT_DIR at most; $usage" >&2; exit 2; }
out="${1:-${TMPDIR:-/tmp}/superbpe-corpora/large}"
mkdir -p "$out/parts"
out="$(cd "$out" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"

# package=version, in the order they are concatenated. Two kernels and two GCCs overlap in part; most of their
# lines still differ, and the measurements report the distinct bytes actually seen.
packages=(
  linux-source-6.1=6.1.192-2
  gcc-12-source=12.2.0-14+deb12u1
  openjdk-17-source=17.0.21.1+2-1~deb12u1
  glibc-source=2.36-9+deb12u14
  binutils-source=2.40-2
  golang-1.19-src=1.19.8-2
  rust-src=1.63.0+dfsg1-2
  linux-source-6.12=6.12.117-1~deb12u1
  gcc-11-source=11.3.0-12
  gdb-source=13.1-3
  rust-web-src=1.96.0+dfsg1-1~deb12u2
  fpc-source-3.2.2=3.2.2+dfsg-20
  lazarus-src-2.2=2.2.6+dfsg2-2
  libboost1.81-dev=1.81.0-5+deb12u1
  openjdk-17-doc=17.0.21.1+2-1~deb12u1
  python3.11-doc=3.11.2-6+deb12u9
)

[ -n "$(ls /var/lib/apt/lists 2>/dev/null | grep -v lock | head -1)" ] || apt-get update -qq

download() {  # download PACKAGE VERSION -> prints the .deb name and the version used
  local pkg="$1" ver="$2"
  if [ -n "$ver" ] && apt-get download -q "$pkg=$ver" >/dev/null 2>&1; then
    echo "$pkg $ver pinned"
  else
    apt-get download -q "$pkg" >/dev/null 2>&1 || { apt-get update -qq; apt-get download -q "$pkg" >/dev/null; }
    echo "$pkg $(dpkg-deb -f "$(ls "$pkg"_*.deb | head -1)" Version) not-pinned(wanted ${ver:-none})"
  fi
}

for spec in "${packages[@]}"; do
  pkg="${spec%%=*}"; ver="${spec#*=}"
  part="$out/parts/$pkg.txt"
  [ -s "$part" ] && continue
  work="$(mktemp -d "$out/.work.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  ( cd "$work"
    download "$pkg" "$ver" > version
    dpkg-deb -x "$pkg"_*.deb deb
    rm -f "$pkg"_*.deb
    mkdir src
    # Unpack the archives a source package ships (tarballs, JDK's src.zip); loose files are taken as they are.
    # A member tar cannot create (a Go test file name longer than the file system allows) is skipped.
    find deb -type f \( -name '*.tar.xz' -o -name '*.tar.gz' -o -name '*.tar.bz2' -o -name '*.tgz' \) | sort |
      while read -r tarball; do tar -xf "$tarball" -C src 2>/dev/null || true; rm -f "$tarball"; done
    find deb -type f -name 'src.zip' | sort |
      while read -r zipfile; do python3 -m zipfile -e "$zipfile" src/jdk 2>/dev/null || true; rm -f "$zipfile"; done
    mv deb src/deb )
  python3 "$here/code_files.py" "$work/src" "$part.tmp"
  mv "$part.tmp" "$part"
  cat "$work/version" >> "$out/parts/versions"
  rm -rf "$work"
  trap - EXIT
  echo "$pkg: $(stat -c %s "$part") bytes" >&2
done

if [ ! -f "$out/READY" ]; then
  rm -f "$out/large.txt"
  for spec in "${packages[@]}"; do cat "$out/parts/${spec%%=*}.txt"; done > "$out/large.txt.tmp"
  mv "$out/large.txt.tmp" "$out/large.txt"
  { echo "# make_large_corpus.sh: package version how"; sort -u "$out/parts/versions"
    for spec in "${packages[@]}"; do echo "part ${spec%%=*} $(stat -c %s "$out/parts/${spec%%=*}.txt")"; done
    echo "large.txt $(stat -c %s "$out/large.txt") sha256 $(sha256sum "$out/large.txt" | cut -d' ' -f1)"
  } > "$out/MANIFEST"
  touch "$out/READY"
fi
cat "$out/MANIFEST"
