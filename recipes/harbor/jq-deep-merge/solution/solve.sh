#!/bin/bash
set -euo pipefail
cd /app/config
jq -n --slurpfile b base.json --slurpfile p prod.json '
  def m(a; o): reduce (o | to_entries[]) as $e (a;
      if $e.value == null then del(.[$e.key])
      elif ($e.value | type) == "object" and (.[$e.key] | type) == "object" then .[$e.key] = m(.[$e.key]; $e.value)
      else .[$e.key] = $e.value end);
  m($b[0]; $p[0])' > merged.json
