"""Tests of querylib.records, the Kafka record-batch codec."""
