#!/usr/bin/env bash
# test_encrypt.sh — payload encryption end to end (docs/security.md, "Payload encryption"):
# a route with --encrypt KEY_ID, `obx relay` sealing payloads with AES-256-GCM before the send,
# the broker's bytes read from outside, a key rotation, and consumers (`obx consume --exec`)
# opening the bodies before the handler; a wrong key and a tampered body are refused.
# Usage: test_encrypt.sh OBX [log|amqp|kafka [CHAOS_KMOCK]] (kafka: the Kafka-protocol mock
# cluster bench/chaos_kmock, the third argument or beside the obx binary; the bytes read with kcat)
#
# Checked:
#   1. every body the broker holds is not the clear payload (no clear text in it, and its length
#      is the payload's plus 28 bytes: nonce and tag); its headers name the key (obx-encryption);
#   2. rotation: events of generation 1 (key k1) and generation 2 (key k2) are all applied, in
#      the clear, by a consumer whose ring holds both;
#   3. a consumer whose ring holds another k1: every k1 message is refused (QUARANTINED: an
#      inbox quarantine row and a parked copy), no effect; the k2 ones are applied;
#   4. a body tampered at the broker (one byte): refused and quarantined, the others applied;
#   5. a relay without the key parks the event of an encrypted route and sends nothing;
#   6. the key bytes appear in no log, no configuration dump and no outbox or broker table;
#   8. `obx migrate --cluster/--topic` writes the new route generation with the same key (a moved
#      route keeps sealing its payloads);
#   7. (log) the reconciler's lookup: an UNKNOWN send (ACKs dropped) is proved by the sealed copy
#      the broker holds (a receipt from source lookup); a copy tampered at the broker, with its
#      headers intact, is quarantined as a corrupt copy and the event is not published.
set -euo pipefail
OBX=${1:?usage: test_encrypt.sh OBX [log|amqp|kafka]}
mode=${2:-log}
source "$(dirname "$0")/../support/prologue.sh" enc
fail_tail=20
db=sqlite:$T/o.db
K1=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
K2=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
KX=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
umask 077
printf '# obx keys\nk1=%s\n' "$K1" >"$T/keys"
case $mode in
  log)
    cluster=local topic=orders relay_broker=log:$T/b.db consume_broker=log:$T/b.db source_=orders
    ;;
  amqp)
    url=${OBX_TEST_AMQP_URL:?OBX_TEST_AMQP_URL is not set}
    tag=enc$$
    cluster=obx-enc topic=obx-enc-$tag source_=obx-enc-q-$tag
    relay_broker="$url?cluster=$cluster&declare_exchange=$topic&declare_queue=$source_"
    consume_broker="$url?cluster=$cluster"
    ;;
  kafka)
    kmock=${3:-$(dirname "$OBX")/bench/chaos_kmock}
    source "$(dirname "$0")/../support/kmock.sh"
    kmock_start "$kmock"
    cluster=kafka-enc topic=orders source_=orders
    relay_broker="kafka://$boot?cluster=$cluster" consume_broker=$relay_broker
    ;;
  *) echo "mode: log, amqp or kafka" >&2; exit 2 ;;
esac

relay_until() { # relay_until N KEYSPEC: runs the relay until N events are PUBLISHED
  local want=$1 spec=$2
  "$OBX" relay --db "$db" --broker "$relay_broker" --set relay.poll_ms=20 --set relay.drain_ms=300 \
    --set "encryption.keys=$spec" >>"$T/relay.log" 2>&1 &
  pids+=($!)
  local n=0
  for _ in $(seq 300); do
    n=$(published "$db")
    [[ $n == "$want" ]] && break
    sleep 0.05
  done
  kill -TERM "${pids[-1]}"
  wait "${pids[-1]}" 2>/dev/null || true
  [[ $n == "$want" ]] || fail "relay published $n of $want"
}
clear1='{"order":"o-1","secret":"card-4111-1"}' # enqueue 1's payload
enqueue() { # enqueue I: one order, its ID appended to ids
  printf '{"order":"o-%d","secret":"card-4111-%d"}' "$1" "$1" |
    "$OBX" enqueue --db "$db" --type order.created.v1 --aggregate "order/o-$1@1" --tenant t1 >>"$T/ids"
}

# ---- generation 1: key k1 ----
"$OBX" init --db "$db" >/dev/null
if [[ $mode == amqp ]]; then
  # one queue per consumer, bound before the first publish (a queue's message goes to one
  # consumer): a relay that only connects declares and binds it
  for qn in good wrong; do
    "$OBX" relay --db "$db" --broker "$url?cluster=$cluster&declare_exchange=$topic&declare_queue=$source_-$qn" \
      --set relay.poll_ms=20 --set relay.drain_ms=100 >>"$T/relay.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do grep -q "broker.*up\|serves cluster\|ready" "$T/relay.log" 2>/dev/null && break; sleep 0.05; done
    sleep 0.5
    kill -TERM "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
  done
fi
"$OBX" route set order.created.v1 --db "$db" --cluster "$cluster" --topic "$topic" --encrypt k1 >/dev/null 2>&1
"$OBX" route list --db "$db" --json | grep -q '"encrypt": *"k1"' || fail "route list does not show encrypt k1"
for i in 1 2 3; do enqueue "$i"; done
relay_until 3 "\${file:$T/keys}"
echo "ok: 3 events of an encrypted route published"

# ---- 1. the broker's bytes, from outside ----
if [[ $mode == log ]]; then
  n=$(sqlite3 "$T/b.db" "SELECT count(*) FROM obx_log_msg")
  [[ $n == 3 ]] || fail "the log holds $n messages, want 3"
  clear=$(sqlite3 "$T/b.db" "SELECT count(*) FROM obx_log_msg WHERE instr(payload, CAST('card-4111' AS BLOB)) > 0 OR instr(payload, CAST('order' AS BLOB)) > 0")
  [[ $clear == 0 ]] || fail "$clear bodies at the broker hold clear text"
  short=$(sqlite3 "$T/b.db" "SELECT count(*) FROM obx_log_msg WHERE length(payload) <> length('{\"order\":\"o-1\",\"secret\":\"card-4111-1\"}') + 28")
  [[ $short == 0 ]] || fail "$short bodies are not the payload's length + 28 (nonce, tag)"
  hk=$(sqlite3 "$T/b.db" "SELECT count(*) FROM obx_log_msg WHERE json_extract(headers, '\$.\"obx-encryption\"') = 'k1'")
  [[ $hk == 3 ]] || fail "$hk of 3 messages name key k1 in their headers"
  echo "ok: the broker holds ciphertext only (no clear text, payload + 28 bytes, key ID header)"
fi
if [[ $mode == kafka ]]; then
  # the topic's bytes as kcat reads them: raw bodies, then each body's size and headers
  kc() { kcat -C -b "$boot" -t orders -o beginning -e -q "$@"; }
  kc -f '%s' >"$T/bodies" || fail "kcat could not read the topic"
  grep -aq 'card-4111\|order' "$T/bodies" && fail "a body at the broker holds clear text"
  kc -f '%S %h\n' >"$T/sizes" || fail "kcat could not read the topic"
  want=$((${#clear1} + 28))
  [[ $(grep -c "^$want .*obx-encryption=k1\(,\|\$\)" "$T/sizes") == 3 ]] ||
    fail "not 3 messages of $want bytes (payload + nonce, tag) naming key k1: $(cat "$T/sizes")"
  echo "ok: the topic holds ciphertext only (kcat: no clear text, payload + 28 bytes, key ID header)"
fi

# ---- 5. a relay without the key parks, never sends in the clear ----
"$OBX" route set order.created.v1 --db "$db" --cluster "$cluster" --topic "$topic" --encrypt k2 >/dev/null 2>&1
enqueue 4
"$OBX" relay --db "$db" --broker "$relay_broker" --set relay.poll_ms=20 --set relay.drain_ms=300 \
  --set "encryption.keys=\${file:$T/keys}" >>"$T/relay.log" 2>&1 &
pids+=($!)
parked=0
wait_state "$db" PARKED 1 >/dev/null || parked=$?
kill -TERM "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
((parked == 0)) || fail "the event sealed with k2 was not parked by a relay without k2"
"$OBX" inspect "$(tail -1 "$T/ids")" --db "$db" --json | grep -q "not in this relay's key ring" ||
  fail "the parked event does not say which key is missing"
if [[ $mode == log ]]; then
  [[ $(sqlite3 "$T/b.db" "SELECT count(*) FROM obx_log_msg") == 3 ]] || fail "a relay without the key sent something"
fi
echo "ok: a relay without key k2 parked the event and sent nothing"

# ---- 2. rotation: k2 added to the ring, generation 2 seals with it ----
printf 'k2=%s\n' "$K2" >>"$T/keys"
"$OBX" requeue "$(tail -1 "$T/ids")" --db "$db" --who test >/dev/null
for i in 5 6; do enqueue "$i"; done
relay_until 6 "\${file:$T/keys}"
echo "ok: after the rotation, 6 events published (3 under k1, 3 under k2)"
if [[ $mode == log ]]; then
  [[ $(sqlite3 "$T/b.db" "SELECT count(*) FROM obx_log_msg WHERE json_extract(headers, '\$.\"obx-encryption\"') = 'k2'") == 3 ]] ||
    fail "not 3 messages sealed with k2"
fi

cat >"$T/handler.sh" <<'SH'
#!/bin/sh
p=$(cat)
echo "$OBX_EVENT_ID $p" >>"$T/effects.$OBX_CONSUMER_ID"
SH
chmod +x "$T/handler.sh"
export T
runs=0
consume() { # consume CONSUMER KEYSPEC [BROKER]
  local src=$source_ idle=1500 more=()
  [[ $mode == amqp ]] && src=$source_-$1
  # Kafka: a group of its own per run, read from the start; a group join takes seconds
  runs=$((runs + 1))
  [[ $mode == kafka ]] && idle=8000 more=(--group "enc-$1-$runs")
  "$OBX" consume --consumer-db "sqlite:$T/c-$1.db" --broker "${3:-$consume_broker}" --topic "$src" \
    --consumer "$1" --types order.created.v1 --tenants t1 --exec "$T/handler.sh" --until-idle $idle \
    --set "encryption.keys=$2" "${more[@]}" --json >"$T/consume-$1.log" 2>&1 || fail "consume $1 failed"
}
cq() { sqlite3 "$T/c-$1.db" "$2"; }

# ---- 2. (cont.) a consumer with both keys applies all 6, in the clear ----
consume good "\${file:$T/keys}"
[[ $(cq good "SELECT count(*) FROM obx_inbox") == 6 ]] || fail "consumer good applied $(cq good "SELECT count(*) FROM obx_inbox") of 6"
[[ $(grep -c '"secret":"card-4111-' "$T/effects.good") == 6 ]] || fail "the handler did not see 6 clear payloads"
grep -q '{"order":"o-5","secret":"card-4111-5"}' "$T/effects.good" || fail "o-5 not seen in the clear"
echo "ok: a consumer holding k1 and k2 applied all 6 events, the handler saw the clear payloads"

# ---- 3. a wrong k1 ----
printf 'k1=%s\nk2=%s\n' "$KX" "$K2" >"$T/wrong"
consume wrong "\${file:$T/wrong}"
[[ $(cq wrong "SELECT count(*) FROM obx_inbox") == 3 ]] || fail "consumer wrong applied $(cq wrong "SELECT count(*) FROM obx_inbox"), want 3 (the k2 ones)"
[[ $(cq wrong "SELECT count(DISTINCT event_id) FROM obx_inbox_quarantine") == 3 ]] || fail "the 3 k1 messages were not quarantined"
[[ $(cq wrong "SELECT count(*) FROM obx_poison WHERE state = 'PARKED'") == 3 ]] || fail "the 3 k1 messages were not parked"
grep -q "o-1" "$T/effects.wrong" && fail "a message under the wrong key reached the handler"
cq wrong "SELECT last_error FROM obx_poison LIMIT 1" | grep -q "does not authenticate" || fail "the parked copy does not say why"
echo "ok: a wrong k1 is refused: 3 quarantined and parked, no effect; the 3 k2 events applied"
# the key added, re-driven: applied
printf 'k1=%s\nk2=%s\n' "$K1" "$K2" >"$T/wrong"
for id in $(head -3 "$T/ids"); do "$OBX" poison redrive "$id" --consumer-db "sqlite:$T/c-wrong.db" --consumer wrong >/dev/null; done
consume wrong "\${file:$T/wrong}"
[[ $(cq wrong "SELECT count(*) FROM obx_inbox") == 6 ]] || fail "after the key was fixed and the copies re-driven: $(cq wrong "SELECT count(*) FROM obx_inbox") of 6"
echo "ok: with the right k1, the re-driven copies are applied"

# ---- 3b. a copy parked after it opened (a contract this consumer did not accept yet) ----
# The parked copy must be the broker's sealed body, not the clear bytes the inbox opened: the
# clear payload stays out of the consumer's database, and a re-drive opens the body again.
# (The inbox does this for every broker; the log broker's topic can be read again from the start.)
if [[ $mode == log ]]; then
  late() { # late TYPES
    "$OBX" consume --consumer-db "sqlite:$T/c-late.db" --broker "$consume_broker" --topic "$source_" \
      --consumer late --types "$1" --tenants t1 --exec "$T/handler.sh" --until-idle 1500 \
      --set "encryption.keys=\${file:$T/keys}" --json >>"$T/consume-late.log" 2>&1 || fail "consume late failed"
  }
  late order.other.v1
  parked=$(cq late "SELECT count(*) FROM obx_poison WHERE state = 'PARKED'")
  [[ $parked == 6 ]] || fail "consumer late parked $parked of 6 (contract not accepted)"
  clear=$(cq late "SELECT count(*) FROM obx_poison WHERE instr(CAST(payload AS TEXT), 'card-4111-') > 0")
  [[ $clear == 0 ]] || fail "$clear parked copies hold the opened (clear) payload, not the broker's sealed body"
  for id in $(cq late "SELECT event_id FROM obx_poison"); do
    "$OBX" poison redrive "$id" --consumer-db "sqlite:$T/c-late.db" --consumer late >/dev/null
  done
  late order.created.v1
  [[ $(cq late "SELECT count(*) FROM obx_inbox") == 6 ]] || fail "after the re-drive: $(cq late "SELECT count(*) FROM obx_inbox") of 6 applied, $(cq late "SELECT count(*) FROM obx_inbox_quarantine") quarantined"
  echo "ok: copies parked after they opened keep the sealed body; re-driven, all 6 applied"
fi

# ---- 4. a body tampered at the broker ----
if [[ $mode == log ]]; then
  id2=$(sed -n 2p "$T/ids")
  sqlite3 "$T/b.db" "UPDATE obx_log_msg SET payload = CAST(substr(payload, 1, 20) AS BLOB) || (CASE WHEN substr(payload, 21, 1) = X'00' THEN X'01' ELSE X'00' END) || CAST(substr(payload, 22) AS BLOB) WHERE event_id = '$id2'"
  consume tamper "\${file:$T/keys}"
  [[ $(cq tamper "SELECT count(*) FROM obx_inbox") == 5 ]] || fail "consumer tamper applied $(cq tamper "SELECT count(*) FROM obx_inbox") of 5"
  [[ $(cq tamper "SELECT event_id FROM obx_inbox_quarantine") == "$id2" ]] || fail "the tampered body was not quarantined"
  grep -q "$id2" "$T/effects.tamper" && fail "the tampered body reached the handler"
  echo "ok: a tampered body is refused and quarantined, the 5 others applied"
fi

# ---- 7. the reconciler's lookup opens the broker's copies ----
if [[ $mode == log ]]; then
  db=sqlite:$T/r.db
  "$OBX" init --db "$db" >/dev/null
  "$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders --encrypt k2 >/dev/null 2>&1
  : >"$T/ids"
  for i in 7 8; do enqueue "$i"; done
  # every ACK dropped, no reconciler: both sends end UNKNOWN with their copies at the broker
  "$OBX" relay --db "$db" --broker "log:$T/r-b.db?drop_ack=1&ack_timeout_ms=50" --set relay.poll_ms=20 \
    --set relay.drain_ms=300 --set relay.reconciler=false --set relay.lease_ms=500 \
    --set "encryption.keys=\${file:$T/keys}" >>"$T/relay.log" 2>&1 &
  pids+=($!)
  unknown() { sqlite3 "$T/r.db" "SELECT count(*) FROM obx_event WHERE state = 'DISPATCH_UNKNOWN'"; }
  for _ in $(seq 200); do [[ $(unknown) == 2 ]] && break; sleep 0.05; done
  kill -TERM "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
  [[ $(unknown) == 2 ]] || fail "the sends did not end UNKNOWN ($(unknown) of 2)"
  # the copy of o-8 tampered at the broker: one byte of its ciphertext, its headers intact
  id8=$(sed -n 2p "$T/ids")
  sqlite3 "$T/r-b.db" "UPDATE obx_log_msg SET payload = CAST(substr(payload, 1, 20) AS BLOB) || (CASE WHEN substr(payload, 21, 1) = X'00' THEN X'01' ELSE X'00' END) || CAST(substr(payload, 22) AS BLOB) WHERE event_id = '$id8'"
  "$OBX" relay --db "$db" --broker "log:$T/r-b.db" --set relay.poll_ms=20 --set relay.drain_ms=300 \
    --set relay.reconcile_ms=50 --set "encryption.keys=\${file:$T/keys}" >>"$T/relay.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 200); do
    [[ $(published "$db") == 1 && $(sqlite3 "$T/r.db" "SELECT count(*) FROM obx_receipt WHERE kind = 'QUARANTINED'") -ge 1 ]] && break
    sleep 0.05
  done
  kill -TERM "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
  id7=$(sed -n 1p "$T/ids")
  [[ $(sqlite3 "$T/r.db" "SELECT state FROM obx_event WHERE event_id = '$id7'") == PUBLISHED ]] ||
    fail "the UNKNOWN send of o-7 was not proved by its sealed copy"
  [[ $(sqlite3 "$T/r.db" "SELECT source FROM obx_receipt WHERE event_id = '$id7' AND kind = 'PRIMARY'") == lookup ]] ||
    fail "o-7's receipt is not from the lookup"
  [[ $(sqlite3 "$T/r.db" "SELECT state FROM obx_event WHERE event_id = '$id8'") != PUBLISHED ]] ||
    fail "a tampered copy with intact headers was accepted as evidence: receipts $(sqlite3 "$T/r.db" "SELECT kind, source, \"offset\", reason FROM obx_receipt WHERE event_id = '$id8'"); copies $(sqlite3 "$T/r-b.db" "SELECT \"offset\", hex(payload) FROM obx_log_msg WHERE event_id = '$id8'")"
  sqlite3 "$T/r.db" "SELECT reason FROM obx_receipt WHERE event_id = '$id8' AND kind = 'QUARANTINED'" |
    grep -q "does not authenticate" || fail "the tampered copy was not quarantined as corrupt"
  echo "ok: the lookup proved an UNKNOWN send by its sealed copy; a tampered copy was quarantined, not accepted"
fi

# ---- 8. a migration's new route generation keeps the key ----
db=sqlite:$T/m.db
"$OBX" init --db "$db" >/dev/null
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders --encrypt k2 >/dev/null 2>&1
enqueue 9
"$OBX" migrate --db "$db" --broker "log:$T/m-b.db" --type order.created.v1 --cluster local \
  --topic orders2 --who test --reason "move" >/dev/null 2>&1 || fail "obx migrate failed"
"$OBX" route list --db "$db" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)[0]
sys.exit(0 if r["topic"] == "orders2" and r.get("encrypt") == "k2" else 1)' ||
  fail "the migration wrote a route generation that does not seal (or not with k2)"
echo "ok: a migration's new route generation keeps sealing with k2"

# ---- 6. no key bytes anywhere ----
for k in "$K1" "$K2"; do
  grep -rqi "$k" "$T"/*.log && fail "a key appears in a log"
  for f in "$T"/o.db "$T"/r.db; do [[ -f $f ]] && sqlite3 "$f" .dump | grep -qi "$k" && fail "a key appears in an outbox database"; done
  if [[ $mode == log ]]; then sqlite3 "$T/b.db" .dump | grep -qi "$k" && fail "a key appears at the broker"; fi
  true
done
"$OBX" config --set "encryption.keys=k1=$K1" >"$T/dump.json" || fail "obx config failed"
grep -q '"encryption.keys": *"\*\*\*"' "$T/dump.json" || fail "obx config does not hide an inline key ring"
grep -qi "$K1" "$T/dump.json" && fail "obx config shows an inline key"
echo "ok: no key bytes in the logs, the outbox, the broker or a configuration dump"
echo "PASS"
