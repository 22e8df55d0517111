#!/usr/bin/env bash
# A one-node Ceph RGW (S3) for the benchmarks: one monitor, one bluestore OSD on a
# sparse file, radosgw. Everything lives under DIR; nothing binds 0.0.0.0.
#
#   bench/rgw.sh start DIR [ADDR] [PORT]   # idempotent; prints the endpoint URL
#   bench/rgw.sh stop DIR                  # idempotent; stops every daemon under DIR
#   bench/rgw.sh status DIR
#
# ADDR defaults to 127.0.0.1 and PORT to 7480. With RGW_NETNS=NAME every daemon runs
# inside that network namespace (monitor and OSD on its own loopback, radosgw on ADDR).
# S3 credentials: access key "testing", secret "testing" (user "bench").
#
# Facts that make it work on a 2-core Debian 12 box: with auth none radosgw also needs
# `ms mon client mode = crc`; `osd pool default pg num = 8` and `mon max pg per osd =
# 1000` let radosgw create its pools; `cluster addr = 127.0.0.1` keeps the OSD off
# 0.0.0.0. Starts in about 20 s.
set -euo pipefail

cmd=${1:?usage: rgw.sh start|stop|status DIR [ADDR] [PORT]}
DIR=$(realpath -m "${2:?DIR}")
ADDR=${3:-127.0.0.1}
PORT=${4:-7480}
MONPORT=${RGW_MON_PORT:-16789}
NS=${RGW_NETNS:-}
CONF=$DIR/ceph.conf
RUN=$DIR/run

inns() { if [[ -n $NS ]]; then ip netns exec "$NS" "$@"; else "$@"; fi; }
alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

write_conf() {
  mkdir -p "$DIR"/{run,log,mon,osd,rgw}
  [[ -f $CONF ]] && return 0
  local fsid; fsid=$(cat /proc/sys/kernel/random/uuid)
  cat >"$CONF" <<EOF
[global]
fsid = $fsid
mon host = v1:127.0.0.1:$MONPORT
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr2 = false
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
mon max pg per osd = 1000
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
run dir = $RUN
pid file = $RUN/\$name.pid
admin socket = $RUN/\$name.asok
log file = $DIR/log/\$name.log
mon data = $DIR/mon/\$name
osd data = $DIR/osd/\$name
keyring = $DIR/keyring
osd objectstore = bluestore
bluestore block path = $DIR/osd/block
bluestore block create = true
bluestore block size = 64424509440
bluestore block db create = false
bluestore block wal create = false
osd memory target = 2147483648
osd op num shards = 2
osd op num threads per shard = 1
osd class update on start = false
mgr initial modules =
[client.rgw.bench]
rgw data = $DIR/rgw
rgw thread pool size = 128
rgw enable usage log = false
EOF
}

start() {
  write_conf
  if alive "$RUN/client.rgw.bench.pid"; then echo "http://$ADDR:$PORT"; return 0; fi
  if [[ -n $NS ]]; then ip netns exec "$NS" ip link set lo up; fi
  if [[ ! -d $DIR/mon/mon.a ]]; then
    ceph-authtool --create-keyring "$DIR/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
    monmaptool --create --fsid "$(ceph-conf -c "$CONF" fsid)" \
      --addv a "[v1:127.0.0.1:$MONPORT]" "$DIR/monmap" >/dev/null
    ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" --keyring "$DIR/keyring"
  fi
  alive "$RUN/mon.a.pid" || inns ceph-mon -c "$CONF" -i a
  if [[ ! -f $DIR/osd/mon.osd-created ]]; then
    local uuid; uuid=$(cat /proc/sys/kernel/random/uuid)
    inns ceph -c "$CONF" --connect-timeout 30 osd create "$uuid" >/dev/null
    mkdir -p "$DIR/osd/osd.0"
    inns ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$uuid" >"$DIR/log/osd-mkfs.log" 2>&1
    touch "$DIR/osd/mon.osd-created"
  fi
  # the OSD's first command to a monitor that has just started can go out before it
  # has the monitor's map ("wrong fsid", EPERM): its init fails, and a retry succeeds
  local try
  for try in 1 2 3 4 5; do
    alive "$RUN/osd.0.pid" && break
    inns ceph-osd -c "$CONF" -i 0 && break
    echo "ceph-osd did not start (try $try); again" >&2
    sleep 2
  done
  alive "$RUN/client.rgw.bench.pid" || inns radosgw -c "$CONF" -n client.rgw.bench --rgw-frontends "beast endpoint=$ADDR:$PORT"
  local i
  for i in $(seq 1 600); do
    if inns curl -s -o /dev/null "http://$ADDR:$PORT/"; then break; fi
    sleep 0.2
  done
  inns curl -s -o /dev/null "http://$ADDR:$PORT/" || { echo "radosgw did not answer; see $DIR/log" >&2; exit 1; }
  if [[ ! -f $DIR/rgw/user-created ]]; then
    inns radosgw-admin -c "$CONF" -n client.admin user create --uid bench \
      --display-name bench --access-key testing --secret testing >/dev/null
    touch "$DIR/rgw/user-created"
  fi
  echo "http://$ADDR:$PORT"
}

stop() {
  local name pidf pid
  for name in client.rgw.bench osd.0 mon.a mgr.x; do
    pidf=$RUN/$name.pid
    if alive "$pidf"; then
      pid=$(cat "$pidf")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidf"
  done
}

status() {
  local name
  for name in mon.a osd.0 client.rgw.bench; do
    if alive "$RUN/$name.pid"; then echo "$name up"; else echo "$name down"; fi
  done
}

case $cmd in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
