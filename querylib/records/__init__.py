"""Kafka record batches (RecordBatch v2, legacy MessageSet v0/v1) and tq control records."""
