#!/bin/bash
# Reward 1 when /app/greeting.txt holds exactly "hello harbor"; the comparison runs in the image's python3.
mkdir -p /logs/verifier
if python3 -c 'import sys; sys.exit(0 if open("/app/greeting.txt").read() == "hello harbor\n" else 1)'; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
