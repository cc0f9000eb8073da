#!/bin/sh
# check_shared_libraries.sh BINARY FORBIDDEN...: fails when `ldd BINARY` lists a
# library whose name starts with one of FORBIDDEN, or one it cannot find.
set -u
bin=$1
shift
deps=$(ldd "$bin") || { echo "FAIL: ldd $bin failed"; exit 1; }
echo "$deps"
status=0
if echo "$deps" | grep -q "not found"; then
  echo "FAIL: $bin has unresolved shared libraries"
  status=1
fi
for lib in "$@"; do
  if echo "$deps" | awk '{print $1}' | grep -q "^$lib"; then
    echo "FAIL: $bin links $lib*"
    status=1
  fi
done
[ $status -eq 0 ] && echo "OK: $bin needs none of: $*"
exit $status
