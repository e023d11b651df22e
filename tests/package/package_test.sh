#!/bin/sh
# package_test.sh SOURCE_DIR C_COMPILER CXX_COMPILER: build the Debian packages as a packager
# would (a tree configured for /usr with Debian's build flags, then cpack -G DEB) in a temporary
# directory, check which files each package holds and its control fields, and run lintian when it
# is installed (errors fail; the warnings it may print are listed in packaging/lintian/, each
# with its reason). Offline: nothing is fetched.
set -eu
src=$1 cc=$2 cxx=$3
for t in dpkg-deb dpkg-shlibdeps dpkg-buildflags cpack; do
	command -v "$t" >/dev/null || { echo "package_test: $t missing (apt-get install dpkg-dev)" >&2; exit 1; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvt-package.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
status=0
fail() {
	echo "package_test: $*" >&2
	status=1
}

export DEB_BUILD_MAINT_OPTIONS=hardening=+all
CFLAGS="$(dpkg-buildflags --get CFLAGS) $(dpkg-buildflags --get CPPFLAGS)"
CXXFLAGS="$(dpkg-buildflags --get CXXFLAGS) $(dpkg-buildflags --get CPPFLAGS)"
LDFLAGS=$(dpkg-buildflags --get LDFLAGS)
export CFLAGS CXXFLAGS LDFLAGS
# Only what the packages hold is built: CMAKE_SKIP_INSTALL_ALL_DEPENDENCY keeps cpack from
# building every tool first.
cmake -S "$src" -B "$tmp/build" -DCMAKE_INSTALL_PREFIX=/usr -DBUILD_TESTING=OFF -DKVT_CUDA=OFF \
	-DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_SKIP_INSTALL_ALL_DEPENDENCY=ON \
	>"$tmp/log" 2>&1 || { cat "$tmp/log" >&2; exit 1; }
cmake --build "$tmp/build" -j 2 --target kvtierd kvtierctl kvtier kvt_man kvt_deb_changelog \
	>"$tmp/log" 2>&1 || { cat "$tmp/log" >&2; exit 1; }
(cd "$tmp/build" && cpack -G DEB -B "$tmp/out") >"$tmp/log" 2>&1 || { cat "$tmp/log" >&2; exit 1; }

deb() { # package name -> its .deb
	f=$(find "$tmp/out" -maxdepth 1 -name "$1_*.deb")
	[ -n "$f" ] || { echo "package_test: no $1 package in: $(ls "$tmp/out")" >&2; exit 1; }
	echo "$f"
}
d_daemon=$(deb kvtierd) d_lib=$(deb libkvtier0) d_dev=$(deb libkvtier-dev)
for d in "$d_daemon" "$d_lib" "$d_dev"; do
	dpkg-deb -c "$d" | awk '{ print $6 }' | sed 's|^\./|/|' >"$d.files"
	echo "== $(basename "$d")"
	sed 's/^/  /' "$d.files"
done
has() { # deb, path (an ERE, anchored)
	grep -Eqx -- "$2" "$1.files" || fail "$(basename "$1") lacks $2"
}
lacks() {
	! grep -Eq -- "$2" "$1.files" || fail "$(basename "$1") holds $(grep -E -- "$2" "$1.files" | head -n 1)"
}
field() { dpkg-deb -f "$1" "$2"; }

multiarch='/usr/lib/[a-z0-9_]+-linux-gnu[a-z0-9_]*'
has "$d_daemon" /usr/bin/kvtierd
has "$d_daemon" /usr/bin/kvtierctl
has "$d_daemon" '(/usr)?/lib/systemd/system/kvtierd.service'
has "$d_daemon" /usr/lib/sysusers.d/kvtier.conf
has "$d_daemon" /usr/lib/tmpfiles.d/kvtier.conf
has "$d_daemon" /usr/share/kvtier/kvtier-thp.conf
has "$d_daemon" /etc/kvtier/kvtierd.conf
has "$d_daemon" /usr/share/man/man8/kvtierd.8.gz
has "$d_daemon" /usr/share/man/man8/kvtierctl.8.gz
has "$d_daemon" /usr/share/man/man5/kvtierd.conf.5.gz
has "$d_daemon" /usr/share/doc/kvtierd/copyright
has "$d_lib" "$multiarch/libkvtier\.so\.0"
has "$d_lib" "$multiarch/libkvtier\.so\.0\.[0-9.]+"
has "$d_lib" /usr/share/doc/libkvtier0/copyright
has "$d_dev" /usr/include/kvtier.h
has "$d_dev" /usr/include/kvtier/kvt_abi.h
has "$d_dev" "$multiarch/libkvtier\.so"
has "$d_dev" "$multiarch/pkgconfig/kvtier\.pc"
has "$d_dev" "$multiarch/cmake/kvtier/kvtierConfig\.cmake"
has "$d_dev" /usr/share/man/man3/libkvtier.3.gz
has "$d_dev" /usr/share/doc/libkvtier-dev/copyright
lacks "$d_daemon" 'libkvtier|/include/'
lacks "$d_lib" '\.so$|/include/|/bin/'
lacks "$d_dev" '\.so\.0|/bin/'
for d in "$d_daemon" "$d_lib" "$d_dev"; do
	lacks "$d" 'kvtier-(bench|sim|llm)|/usr/include/kvt_abi\.h'
done

# Control: the conffile, the unit's paths, the shlibs chain, and dpkg-shlibdeps' Depends.
dpkg-deb --ctrl-tarfile "$d_daemon" | tar -xO ./conffiles | grep -qx /etc/kvtier/kvtierd.conf ||
	fail "kvtierd: /etc/kvtier/kvtierd.conf is not a conffile"
unit=$(grep -E '/systemd/system/kvtierd.service$' "$d_daemon.files")
dpkg-deb --fsys-tarfile "$d_daemon" | tar -xO ".$unit" |
	grep -qx 'ExecStart=/usr/bin/kvtierd --config /etc/kvtier/kvtierd.conf' ||
	fail "kvtierd.service: ExecStart does not name /usr/bin/kvtierd and /etc/kvtier/kvtierd.conf"
dpkg-deb --ctrl-tarfile "$d_lib" | tar -xO ./shlibs | grep -Eqx 'libkvtier 0 libkvtier0 \(>= [0-9.]+\)' ||
	fail "libkvtier0: no shlibs line for libkvtier.so.0"
dpkg-deb --ctrl-tarfile "$d_lib" | tar -xO ./triggers | grep -qx 'activate-noawait ldconfig' ||
	fail "libkvtier0: no ldconfig trigger"
version=$(field "$d_lib" Version)
echo "$(field "$d_dev" Depends)" | grep -qF "libkvtier0 (= $version)" ||
	fail "libkvtier-dev Depends: '$(field "$d_dev" Depends)', not libkvtier0 (= $version)"
for lib in libc6 liburing2 libinih1 libjson-c5 libnuma1 libsystemd0; do
	field "$d_daemon" Depends | grep -q "$lib" || fail "kvtierd Depends lacks $lib: $(field "$d_daemon" Depends)"
done
for d in "$d_daemon" "$d_lib" "$d_dev"; do
	for f in Maintainer Section Description; do
		[ -n "$(field "$d" $f)" ] || fail "$(basename "$d"): no $f"
	done
done

if command -v lintian >/dev/null; then
	# Errors fail; warnings are printed (each override in packaging/lintian/ says why).
	lintian --fail-on error "$d_daemon" "$d_lib" "$d_dev" ||
		fail "lintian found errors"
else
	echo "package_test: lintian not installed (apt-get install lintian): not run"
fi
exit $status
