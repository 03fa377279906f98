#!/bin/sh
# A command template's script (tests/acceptance/test_commands.py): prints its numbers FROM..TO
# into the test sink, one a DELAY, checkpointing every 100; resumes from DTASK_CHECKPOINT;
# exits 3 at the number FAIL; writes TAG, as it got it, beside its numbers; says each number on
# its stdout, and what it counted at its end; its protocol lines go to fd 3.
from=$2 to=$4 tag=$6 fail=$8
next=$from
case "$DTASK_CHECKPOINT" in
  *next*) next=$(printf '%s' "$DTASK_CHECKPOINT" | tr -dc '0-9') ;;
esac
out="$DTASK_TEST_SINK/$DTASK_RUN_ID-$DTASK_CHILD_INDEX"
printf '%s' "$tag" > "$out.tag"
i=$next
while [ "$i" -le "$to" ]; do
  if [ "$i" -eq "$fail" ]; then
    echo "number $i is bad" >&2
    exit 3
  fi
  echo "$i" >> "$out.txt"
  echo "number $i"
  sleep "$DELAY"
  i=$((i + 1))
  if [ $(((i - from) % 100)) -eq 0 ]; then
    echo "::checkpoint {\"next\": $i}" >&3
  fi
done
echo "counted $from..$to"
echo "::result {\"count\": $((to - from + 1))}" >&3
