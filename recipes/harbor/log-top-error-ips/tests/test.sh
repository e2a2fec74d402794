#!/bin/bash
# The log is regenerated from its seed by the verifier; the agent's copy is never read.
mkdir -p /logs/verifier
if python3 -I /tests/check_top_ips.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
