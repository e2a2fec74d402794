#!/bin/bash
# The expected objects are recomputed from the verifier's own copy of events.jsonl.
mkdir -p /logs/verifier
if python3 -I /tests/check_latest.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
