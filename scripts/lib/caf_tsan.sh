# Sourced by scripts/sanitize. Builds CAF's core library with
# -fsanitize=thread, so ThreadSanitizer sees the synchronization inside CAF's
# mailboxes and scheduler instead of reporting every message as a race.
#
# The source is Debian's own package of the CAF that libcaf-dev ships
# (actor-framework 0.17.6), fetched with `apt-get source` after adding a
# deb-src entry for bookworm. Only libcaf_core is built; it installs into
# $caf_tsan_prefix (outside the repository) and is reused while that
# prefix holds a library built from the same version.
#
#   caf_tsan_ensure CXX      -> sets caf_tsan_prefix; builds when missing
#
# The installed headers must be byte-identical to /usr/include/caf (the
# library replaces Debian's at run time, so the ABI must match); the build
# stops if they are not.

caf_tsan_version="0.17.6"
caf_tsan_source="actor-framework"
caf_tsan_prefix="${BOTMESH_CAF_TSAN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/botmesh/caf-tsan}"

# Adds the bookworm deb-src entry apt needs for `apt-get source`.
caf_tsan_add_deb_src() {
  local list=/etc/apt/sources.list.d/botmesh-deb-src.sources
  if [ -f "$list" ] || grep -rqs '^Types:.*deb-src\|^deb-src ' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    return 0
  fi
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "sanitize: adding $list for apt-get source" >&2
  $sudo tee "$list" >/dev/null <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  $sudo apt-get update -qq >&2
}

# Downloads and unpacks the source into $1; prints the source directory.
caf_tsan_fetch() {
  local work="$1" dir="$1/actor-framework-$caf_tsan_version"
  caf_tsan_add_deb_src
  (
    cd "$work"
    # A full `apt-get source` also applies Debian's packaging. When the
    # archive serves only the upstream tarball (the .debian.tar can be
    # missing from a mirror), apt verifies what it fetched against the
    # signed index and the upstream tarball is unpacked by hand.
    if ! apt-get source -qq "$caf_tsan_source=$caf_tsan_version-*" >&2 2>"$work/apt.log" \
      && ! apt-get source -qq "$caf_tsan_source" >&2 2>>"$work/apt.log"; then
      if [ ! -f "${caf_tsan_source}_${caf_tsan_version}.orig.tar.gz" ]; then
        cat "$work/apt.log" >&2
        echo "sanitize: could not fetch the CAF source package" >&2
        exit 1
      fi
      echo "sanitize: using the upstream tarball of Debian's source package" >&2
      tar xzf "${caf_tsan_source}_${caf_tsan_version}.orig.tar.gz"
    fi
  ) || return 1
  [ -f "$dir/libcaf_core/CMakeLists.txt" ] || {
    echo "sanitize: unexpected CAF source layout in $work" >&2
    return 1
  }
  echo "$dir"
}

caf_tsan_ensure() {
  local cxx="$1"
  local stamp="$caf_tsan_prefix/.botmesh-caf-tsan"
  local want="caf $caf_tsan_version tsan $($cxx --version | head -n1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
     && [ -f "$caf_tsan_prefix/lib/libcaf_core.so.$caf_tsan_version" ]; then
    return 0
  fi
  echo "sanitize: building CAF $caf_tsan_version (core) with -fsanitize=thread into $caf_tsan_prefix" >&2
  local work rc=0
  work="$(mktemp -d)"
  caf_tsan_build "$cxx" "$work" || rc=1
  rm -rf "$work"
  [ "$rc" -eq 0 ] || return 1
  echo "$want" >"$stamp"
}

# Fetches, builds and installs into $caf_tsan_prefix, working in $2.
caf_tsan_build() {
  local cxx="$1" work="$2" src
  src="$(caf_tsan_fetch "$work")" || return 1
  # The same configuration as Debian's build (log level QUIET, exceptions
  # and memory management on), core only, against libstdc++.
  cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" \
    -DCMAKE_INSTALL_PREFIX="$caf_tsan_prefix" \
    -DCAF_NO_AUTO_LIBCPP=ON -DCAF_NO_IO=ON -DCAF_NO_EXAMPLES=ON \
    -DCAF_NO_UNIT_TESTS=ON -DCAF_NO_TOOLS=ON -DCAF_NO_OPENSSL=ON \
    -DCAF_NO_OPENCL=ON -DCAF_NO_PYTHON=ON -DCAF_NO_SUMMARY=ON \
    -DCAF_LOG_LEVEL=QUIET >"$work/configure.log" 2>&1 \
    || { cat "$work/configure.log" >&2; return 1; }
  cmake --build "$work/build" -j2 >"$work/build.log" 2>&1 \
    || { tail -n 50 "$work/build.log" >&2; return 1; }
  rm -rf "$caf_tsan_prefix"
  cmake --install "$work/build" >"$work/install.log" 2>&1 \
    || { cat "$work/install.log" >&2; return 1; }
  # Every installed header must be Debian's (libcaf-dev also ships the io
  # and openssl modules' headers, which are not built here).
  local h bad=0
  while IFS= read -r h; do
    if ! cmp -s "$caf_tsan_prefix/include/$h" "/usr/include/$h"; then
      echo "sanitize: $h differs from /usr/include/$h" >&2
      bad=1
    fi
  done < <(cd "$caf_tsan_prefix/include" && find caf -type f)
  if [ "$bad" -ne 0 ]; then
    rm -rf "$caf_tsan_prefix"
    echo "sanitize: CAF headers differ from Debian's libcaf-dev; refusing to mix them" >&2
    return 1
  fi
}
