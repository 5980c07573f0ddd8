DROP TABLE upstreams;
