#!/usr/bin/env bash
# The Debian package of trainwatchd (cpack): its control data and contents,
# lintian with no errors, and the packaged configuration taken at its word:
# the extracted trainwatchd started with the packaged flags file (paths moved
# into a scratch root) serves, and refuses a caller with no token.
#   deb_package_test.sh BUILD_DIR VERSION
set -euo pipefail
build=$1 version=$2
tmp=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

rm -rf "$build/package"
cmake --build "$build" --target package >"$tmp/cpack.log" 2>&1 ||
  { tail -40 "$tmp/cpack.log"; fail "cpack"; }
deb=$(ls "$build"/package/trainwatchd_"$version"_*.deb) || fail "no trainwatchd_${version}_*.deb"

echo "== dpkg-deb --info"
dpkg-deb --info "$deb" | tee "$tmp/info"
field() { dpkg-deb --field "$deb" "$1"; }
[ "$(field Package)" = trainwatchd ] || fail "Package: $(field Package)"
[ "$(field Version)" = "$version" ] || fail "Version: $(field Version)"
depends=$(field Depends)
for dep in adduser libc6 libgrpc++ libsqlite3 libprometheus-cpp libcurl; do
  grep -q "$dep" <<<"$depends" || fail "Depends lacks $dep: $depends"
done
for script in postinst prerm postrm conffiles md5sums; do
  grep -qw "$script" "$tmp/info" || fail "no $script in the control archive"
done
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles | sort >"$tmp/conffiles"
printf '%s\n' /etc/trainwatch/pager.json /etc/trainwatch/rules.json \
  /etc/trainwatch/tokens.json /etc/trainwatch/trainwatchd.flags >"$tmp/want"
diff "$tmp/want" "$tmp/conffiles" || fail "conffiles differ from the files in /etc/trainwatch"

echo "== dpkg-deb --contents"
dpkg-deb --contents "$deb" | tee "$tmp/contents"
for f in ./usr/bin/trainwatchd ./usr/bin/twctl ./lib/systemd/system/trainwatchd.service \
         ./etc/trainwatch/trainwatchd.flags ./etc/trainwatch/tokens.json \
         ./etc/trainwatch/rules.json ./etc/trainwatch/pager.json \
         ./usr/share/doc/trainwatchd/copyright ./usr/share/doc/trainwatchd/changelog.gz \
         ./usr/share/doc/trainwatchd/README.md ./usr/share/doc/trainwatchd/docs/server.md \
         ./usr/share/man/man8/trainwatchd.8.gz ./usr/share/man/man1/twctl.1.gz; do
  grep -q " $f\$" "$tmp/contents" || fail "not in the package: $f"
done
if grep -E '\.a$|/include/|/cmake/' "$tmp/contents"; then
  fail "development files in the server package"
fi
awk '{print $2}' "$tmp/contents" | grep -vx 'root/root' && fail "a file not owned by root"

echo "== lintian"
# lintian exits non-zero on an error-level tag (its default --fail-on) or
# when it cannot run; warnings are listed and allowed.
rc=0
lintian --tag-display-limit 0 "$deb" >"$tmp/lintian" 2>&1 || rc=$?
cat "$tmp/lintian"
grep -q '^E: ' "$tmp/lintian" && fail "lintian reports errors"
[ "$rc" -eq 0 ] || fail "lintian exited with status $rc"

echo "== the packaged configuration, in a scratch root"
dpkg-deb -x "$deb" "$tmp/root"
"$tmp/root/usr/bin/trainwatchd" --version | grep -qx "trainwatchd $version" ||
  fail "trainwatchd --version"
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$tmp/root/var/lib/trainwatch"
sed -e "s|/etc/trainwatch|$tmp/root/etc/trainwatch|; s|/var/lib/trainwatch|$tmp/root/var/lib/trainwatch|" \
    -e "s|^--listen=.*|--listen=127.0.0.1:$port|; s|^--metrics_listen=.*|--metrics_listen=|" \
    "$tmp/root/etc/trainwatch/trainwatchd.flags" >"$tmp/flags"
grep -q "^--flagfile=/etc/trainwatch/trainwatchd.flags" <(sed -n 's/^ExecStart=[^ ]* //p' \
  "$tmp/root/lib/systemd/system/trainwatchd.service" | tr ' ' '\n') ||
  fail "the unit does not read the packaged flags file"
"$tmp/root/usr/bin/trainwatchd" --flagfile="$tmp/flags" >"$tmp/trainwatchd.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
  out=$("$tmp/root/usr/bin/twctl" --server "127.0.0.1:$port" runs 2>&1) && fail "served a call with no token: $out"
  grep -qi "unauthenticated\|token" <<<"$out" && break
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/trainwatchd.log"; fail "trainwatchd exited"; }
  sleep 0.1
done
grep -qi "unauthenticated\|token" <<<"$out" || { echo "$out"; fail "no refusal from trainwatchd"; }
[ -f "$tmp/root/var/lib/trainwatch/trainwatch.db" ] || fail "no database in the state folder"
echo "twctl without a token: $out"
echo "PASS: $(basename "$deb"): control data, contents, lintian, packaged configuration"
