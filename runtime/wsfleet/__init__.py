"""wsfleet: a fleet of workers holding long-lived outbound WebSocket connections,
with exactly one owner per connection decided by DynamoDB leases."""

__version__ = "0.1.0"
