-- hetmem benchmarks — a sqlite3 workload for whole-program timing and trace
-- recording: a table filled by a recursive CTE, an index, grouping, joins,
-- string functions and updates. SPDX-License-Identifier: MIT
--   sqlite3 :memory: -cmd ".parameter set @n 40000" < sqlite.sql
CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, name TEXT, body TEXT);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < @n)
INSERT INTO t(k, name, body)
  SELECT (x * 7919) % 1000, 'name-' || (x % 977), printf('%.*c', 10 + x % 200, 'z') FROM c;
CREATE INDEX t_k ON t(k);
CREATE TABLE g AS SELECT k, count(*) AS n, sum(length(body)) AS len, group_concat(name, ',') AS names
  FROM t GROUP BY k;
SELECT count(*), sum(n), sum(len), sum(length(names)) FROM g;
SELECT count(*) FROM t JOIN g USING (k) WHERE t.id % 3 = 0 AND g.n > 30;
UPDATE t SET body = upper(body) || name WHERE k % 5 = 0;
SELECT sum(length(replace(body, 'Z', 'yy'))) FROM t WHERE k < 500;
DELETE FROM t WHERE k % 7 = 0;
SELECT count(*), max(id) FROM t;
