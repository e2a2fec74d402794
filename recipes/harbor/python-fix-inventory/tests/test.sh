#!/bin/bash
# The module runs in a child process on cases made here; its answers are judged in this process.
mkdir -p /logs/verifier
if python3 -I /tests/check_inventory.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
