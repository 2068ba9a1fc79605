-- SQLite with a large page cache (the CLI gives it one buffer: -pagecache): generated rows, two
-- indexes, a window function, a join and an update; results are compared with the native run's.
PRAGMA cache_size = -262144;
PRAGMA journal_mode = OFF;
PRAGMA synchronous = OFF;
PRAGMA temp_store = MEMORY;
CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, grp INTEGER, name TEXT, pad BLOB);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 150000)
INSERT INTO t
SELECT i, (i * 2654435761) % 1000003, i % 97, printf('name-%08d-%d', (i * 7919) % 400009, i % 13),
       zeroblob(100 + i % 300)
FROM n;
CREATE INDEX t_k ON t(k, name);
CREATE INDEX t_grp ON t(grp, k);
SELECT count(*), sum(k), sum(length(pad)) FROM t;
SELECT grp, count(*), min(k), max(k), sum(k % 1000) FROM t GROUP BY grp ORDER BY grp LIMIT 10;
SELECT id, k, name FROM t WHERE k BETWEEN 500000 AND 500050 ORDER BY k, id;
SELECT count(*) FROM t a JOIN t b ON a.k = b.k + 1;
SELECT sum(rn * k % 1000003) FROM (SELECT k, row_number() OVER (ORDER BY name DESC, id) AS rn FROM t);
UPDATE t SET k = k + 1 WHERE grp < 30;
SELECT count(DISTINCT k), sum(k) FROM t;
