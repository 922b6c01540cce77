"""The CDK stacks that deploy wsfleet: a stateful stack (tables, queue) and a service
stack (network, API, router, worker fleet, alarms), once per environment."""
