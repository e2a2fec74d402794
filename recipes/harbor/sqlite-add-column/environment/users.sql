CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL);
INSERT INTO users VALUES
  (1, 'Ann Kowal', 'Ann@Mail.Example.COM'),
  (2, 'Bram de Vries', 'bram@uni.example.nl'),
  (3, 'Carla Ruiz', 'carla.ruiz@example.org'),
  (4, 'Dmitri Volkov', 'DV@EXAMPLE.RU'),
  (5, 'Emeka Obi', 'emeka+news@mail.example.com'),
  (6, 'Fiona Walsh', 'fiona@example.ie'),
  (7, 'Goro Tanaka', 'goro@sub.example.jp'),
  (8, 'Hana Novak', 'hana@Example.CZ'),
  (9, 'Ines Costa', 'ines@example.pt'),
  (10, 'Jai Mehta', 'jai@example.in'),
  (11, 'Kai Weber', 'kai@example.de'),
  (12, 'Lena Fischer', 'lena.fischer@mail.example.com');
