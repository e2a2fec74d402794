"""Child process of the verifier: imports the agent's inventory module, plays the cases read on
standard input, prints the results as one JSON line. The verifier never imports the agent's code."""

import copy
import json
import sys

sys.path.insert(0, "/app/inventory")
cases = json.loads(sys.stdin.read())
from inventory import apply_orders, to_restock  # noqa: E402

out = []
for stock, orders, threshold in cases:
    before = copy.deepcopy(stock)
    after = apply_orders(stock, [tuple(o) for o in orders])
    out.append({"after": after, "untouched": stock == before, "restock": to_restock(after, threshold)})
sys.stdout.write(json.dumps(out) + "\n")
