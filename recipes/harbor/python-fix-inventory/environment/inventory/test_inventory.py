import unittest

from inventory import apply_orders, to_restock


class InventoryTest(unittest.TestCase):
    def test_subtracts(self):
        self.assertEqual(apply_orders({"A-1": 5}, [("A-1", 2)]), {"A-1": 3})

    def test_unknown_sku_ignored(self):
        self.assertEqual(apply_orders({"A-1": 5}, [("Z-9", 2)]), {"A-1": 5})

    def test_restock(self):
        self.assertEqual(to_restock({"A-1": 1, "B-2": 9}, 3), ["A-1"])


if __name__ == "__main__":
    unittest.main()
