#!/bin/bash
# Partial credit through reward.json: 1.0 for the right count, 0.5 for a count off by one, else 0.
mkdir -p /logs/verifier
got=$(tr -d '[:space:]' < /data/count 2>/dev/null)
case "$got" in
  5) r=1.0 ;;
  4|6) r=0.5 ;;
  *) r=0.0 ;;
esac
printf '{"reward": %s}\n' "$r" > /logs/verifier/reward.json
