#!/bin/bash
# Judges main's commits and trees with git plumbing under a pinned configuration.
mkdir -p /logs/verifier
if python3 -I /tests/check_merge_commit.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
