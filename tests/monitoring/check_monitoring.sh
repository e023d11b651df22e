#!/bin/sh
# check_monitoring.sh SRC KVTIERD KVTIERCTL KVTIER_SIM
set -eu
src=$1 kvtierd=$2 kvtierctl=$3 sim=$4
mon=$src/monitoring

fail() {
	echo "check_monitoring: $*" >&2
	exit 1
}

command -v promtool >/dev/null ||
	fail "promtool not found: install Debian's prometheus package (tools/quickstart.sh does)"

promtool check rules "$mon/kvtier-alerts.yml" || fail "promtool check rules failed"
(cd "$mon" && promtool test rules kvtier-alerts.test.yml) || fail "alert rule tests failed"
python3 -m json.tool "$mon/kvtier-dashboard.json" >/dev/null || fail "dashboard is not JSON"

dir=$(mktemp -d /tmp/kvt-mon-XXXXXX)
pid=
store=
cleanup() {
	[ -z "$pid" ] || kill "$pid" 2>/dev/null || true
	[ -z "$pid" ] || wait "$pid" 2>/dev/null || true
	rm -rf "$dir"
	[ -z "$store" ] || rm -f "$store"
}
trap cleanup EXIT
sock=$dir/kvtierd.sock
# A spill store, so that its families (kvtier_spill_*) are in the scrape: on a file system with
# O_DIRECT that is not memory ($KVT_SPILL_TEST_DIR, /var/tmp, /tmp), as the spill tests pick it.
for d in ${KVT_SPILL_TEST_DIR:-} /var/tmp /tmp; do
	case $(stat -f -c %T "$d" 2>/dev/null) in "" | tmpfs | ramfs) continue ;; esac
	if dd if=/dev/zero of="$d/kvt-mon-probe-$$" bs=4096 count=1 oflag=direct 2>/dev/null &&
		dd if="$d/kvt-mon-probe-$$" of=/dev/null bs=4096 count=1 iflag=direct 2>/dev/null; then
		store=$d/kvt-mon-spill-$$.dat
	fi
	rm -f "$d/kvt-mon-probe-$$"
	[ -z "$store" ] || break
done
[ -n "$store" ] || fail "no directory here supports O_DIRECT: set KVT_SPILL_TEST_DIR"
printf '[spill]\npath = %s\nsize = 16M\n' "$store" >"$dir/kvtierd.conf"
"$kvtierd" --config "$dir/kvtierd.conf" --socket "$sock" --pool-size 64M --lock no --backend host \
	--metrics-listen 127.0.0.1:0 2>"$dir/log" &
pid=$!
i=0
until "$kvtierctl" --socket "$sock" status >/dev/null 2>&1; do
	i=$((i + 1))
	[ $i -lt 500 ] || fail "kvtierd did not start: $(cat "$dir/log")"
	kill -0 "$pid" 2>/dev/null || fail "kvtierd exited: $(cat "$dir/log")"
	sleep 0.02
done

# A client holds sequences open while the metrics are taken, over the control socket and over
# HTTP (the scrape Prometheus does).
url=$("$kvtierctl" --socket "$sock" status | sed -n 's/^metrics  *//p')
port=${url#http://127.0.0.1:}
port=${port%/metrics}
"$sim" --socket "$sock" --clients 1 --steps 256 --layers 2 --kv-heads 1 --head-dim 32 \
	--then "'$kvtierctl' --socket '$sock' metrics >'$dir/ctl.prom' &&
		'$kvtierctl' --socket '$sock' metrics --sessions >'$dir/sessions.prom' &&
		python3 -c 'import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1]).read().decode())' \
			'http://127.0.0.1:$port/metrics' >'$dir/http.prom'" >/dev/null ||
	fail "kvtier-sim failed"

for f in ctl sessions http; do
	[ -s "$dir/$f.prom" ] || fail "no metrics in $f.prom"
	promtool check metrics <"$dir/$f.prom" >"$dir/$f.lint" 2>&1 ||
		fail "promtool check metrics ($f): $(cat "$dir/$f.lint")"
	[ ! -s "$dir/$f.lint" ] || fail "promtool check metrics ($f) says: $(cat "$dir/$f.lint")"
done
grep -q '^kvtier_client_sessions{client="' "$dir/ctl.prom" || fail "no client families"
grep -q '^kvtier_session_info{' "$dir/sessions.prom" || fail "no session families on request"
grep -q '^kvtier_spill_size_bytes 16777216$' "$dir/http.prom" || fail "no spill store families"

# Every metric the dashboard and the rules name exists (histograms by their family name).
names=$(cat "$mon/kvtier-dashboard.json" "$mon/kvtier-alerts.yml" |
	grep -o -E '(kvtier|process)_[a-z0-9_]+' | sed -E 's/_(bucket|sum|count)$//' | sort -u)
[ -n "$names" ] || fail "no metric names found in monitoring/"
for n in $names; do
	grep -q "^# TYPE $n " "$dir/ctl.prom" || fail "monitoring/ uses $n, which kvtierd does not export"
done
# and the daemon that served it all stops cleanly (a sanitizer report would fail it here)
kill "$pid"
st=0
wait "$pid" || st=$?
pid=
[ "$st" = 0 ] || fail "kvtierd exited $st: $(cat "$dir/log")"
echo "monitoring: rules, rule tests, $(echo "$names" | wc -l) metric names and 3 scrapes check out"
