#!/bin/bash
# Reads the repository with git plumbing only (no hooks, no repository config that runs programs).
mkdir -p /logs/verifier
if python3 -I /tests/check_restore.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
