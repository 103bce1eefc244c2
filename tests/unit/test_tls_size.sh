#!/usr/bin/env bash
# test_tls_size.sh OBX — obx's thread-local storage stays small. Static TLS is allocated and
# zeroed in every thread of the process, the 20 threads librdkafka starts for a relay's handles
# included: a 257 x 257 thread-local table (src/drivers/catalog.c) made it 516 KiB a thread, 12
# MiB of a Kafka relay's resident memory. The limit, 16 KiB, leaves room for error buffers.
set -euo pipefail
obx=$1
lib=$(dirname "$obx")/libobx.so
status=0
for f in "$obx" "$lib"; do
  [[ -e $f ]] || continue
  # the TLS program header's MemSiz (hex): what each thread gets
  size=$(readelf -lW "$f" | awk '$1 == "TLS" { print $6 }')
  bytes=$((${size:-0}))
  if ((bytes > 16384)); then
    echo "FAIL: $f: thread-local storage $bytes bytes a thread, over 16384"
    status=1
  else
    echo "ok: $f: thread-local storage $bytes bytes a thread"
  fi
done
exit $status
