#!/bin/sh
# A stealable command template's script (tests/acceptance/test_elastic.py): prints FROM..TO
# into the test sink, one a DELAY, ten times that from SLOW_FROM to SLOW_TO; checkpoints
# {"done": k} every 5 numbers and reads back the last number it still owns (a steal may have
# given the rest to a new child; with stdin closed, as for stealable = false, it keeps TO).
from=$1 to=$2 slow_from=$3 slow_to=$4
done=0
case "$DTASK_CHECKPOINT" in
  *done*) done=$(printf '%s' "$DTASK_CHECKPOINT" | tr -dc '0-9') ;;
esac
out="$DTASK_TEST_SINK/$DTASK_RUN_ID-$DTASK_CHILD_INDEX.txt"
i=$((from + done))
while [ "$i" -le "$to" ]; do
  if [ "$i" -ge "$slow_from" ] && [ "$i" -le "$slow_to" ]; then sleep "$SLOW"; else sleep "$DELAY"; fi
  echo "$i" >> "$out"
  i=$((i + 1))
  done=$((done + 1))
  if [ $((done % 5)) -eq 0 ]; then
    echo "::checkpoint {\"done\": $done}" >&3
    if read -r end; then to=$end; fi
  fi
done
