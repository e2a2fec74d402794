"""Stock bookkeeping for a small shop."""


def apply_orders(stock, orders):
    """Return a new dict: each order's quantity subtracted from its SKU's stock, clamped at 0.

    Orders for SKUs not in ``stock`` are ignored; ``stock`` is not modified.
    """
    for sku, qty in orders:
        if sku in stock:
            stock[sku] = stock[sku] - qty
    return stock


def to_restock(stock, threshold):
    """The SKUs whose quantity is at most ``threshold``, sorted ascending."""
    return [sku for sku, qty in stock.items() if qty < threshold]
