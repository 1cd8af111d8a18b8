"""The monitor: the population of each app (``population``: pure fusion; ``census``: the fan-out over the
channel), the page on ``metrics_listen`` (``page``: ``GET /monitor`` and its JSON), its basic auth
(``auth``), and the terminal view of ``elasticctl pool --watch`` (``terminal``)."""
