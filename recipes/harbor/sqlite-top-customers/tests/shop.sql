CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                     status TEXT NOT NULL, quantity INTEGER NOT NULL, unit_price REAL NOT NULL);
INSERT INTO customers VALUES (1, 'Ada Byrne'), (2, 'Ben Okafor'), (3, 'Chloe Martin'), (4, 'Dev Patel'),
  (5, 'Elin Berg'), (6, 'Farid Haddad'), (7, 'Greta Lind'), (8, 'Hugo Blanc');
INSERT INTO orders VALUES
  (1, 1, 'paid', 3, 120.00), (2, 1, 'refunded', 10, 99.90), (3, 1, 'paid', 1, 15.50),
  (4, 2, 'paid', 20, 25.00), (5, 2, 'pending', 50, 30.00), (6, 2, 'paid', 2, 12.25),
  (7, 3, 'paid', 7, 49.99), (8, 3, 'paid', 1, 160.00), (9, 3, 'cancelled', 30, 80.00),
  (10, 4, 'pending', 100, 19.99), (11, 4, 'paid', 1, 9.99),
  (12, 5, 'paid', 12, 42.00), (13, 5, 'paid', 1, 6.00),
  (14, 6, 'paid', 4, 99.50), (15, 6, 'paid', 4, 27.00), (16, 6, 'Paid', 9, 100.00),
  (17, 7, 'paid', 5, 101.30), (18, 7, 'paid', 2, 1.35),
  (19, 8, 'refunded', 40, 55.00), (20, 8, 'paid', 6, 8.75),
  (21, 5, 'paid', 2, 3.00), (22, 3, 'paid', 1, 0.01);
