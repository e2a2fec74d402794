#!/bin/bash
set -euo pipefail
cat > /app/inventory/inventory.py <<'PY'
"""Stock bookkeeping for a small shop."""


def apply_orders(stock, orders):
    """Return a new dict: each order's quantity subtracted from its SKU's stock, clamped at 0.

    Orders for SKUs not in ``stock`` are ignored; ``stock`` is not modified.
    """
    after = dict(stock)
    for sku, qty in orders:
        if sku in after:
            after[sku] = max(0, after[sku] - qty)
    return after


def to_restock(stock, threshold):
    """The SKUs whose quantity is at most ``threshold``, sorted ascending."""
    return sorted(sku for sku, qty in stock.items() if qty <= threshold)
PY
cd /app/inventory && python3 -m unittest -q 2>&1 | tail -1
