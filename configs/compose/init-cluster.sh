#!/bin/bash
# One-shot initialisation of docker-compose.yml's cluster: the three replica sets, then both
# shards added through a temporary mongos (addShard is run by a router; Sluice does not send it).
set -euo pipefail

wait_for() {
  until mongosh --quiet "mongodb://$1/?directConnection=true" --eval 'db.adminCommand({ping: 1})' >/dev/null 2>&1; do
    sleep 1
  done
}

initiate() { # set port member...
  local set=$1 port=$2 configsvr=$3; shift 3
  local members="" i=0
  for h in "$@"; do
    members="$members{_id: $i, host: '$h:$port'},"
    i=$((i + 1))
  done
  wait_for "$1:$port"
  mongosh --quiet "mongodb://$1:$port/?directConnection=true" --eval "
    try { rs.status() } catch (e) {
      rs.initiate({_id: '$set', configsvr: $configsvr, members: [$members]})
    }"
  until mongosh --quiet "mongodb://$1:$port/?directConnection=true" --eval 'db.hello().isWritablePrimary' | grep -q true; do
    sleep 1
  done
}

initiate configRS 27019 true cfg1 cfg2 cfg3
initiate shard0 27018 false s0a s0b s0c
initiate shard1 27018 false s1a s1b s1c

mongos --configdb configRS/cfg1:27019,cfg2:27019,cfg3:27019 --port 27017 --bind_ip 127.0.0.1 &
MONGOS=$!
wait_for 127.0.0.1:27017
mongosh --quiet mongodb://127.0.0.1:27017 --eval "
  sh.addShard('shard0/s0a:27018,s0b:27018,s0c:27018');
  sh.addShard('shard1/s1a:27018,s1b:27018,s1c:27018');
"
kill $MONGOS
echo "cluster initialised: configRS, shard0, shard1"
