"""Capacity and cost plan: the fleet at any size, computed from the per-operation counts a
benchmark run measured. Pure arithmetic, no AWS calls; ``wsfleet plan`` and ``make bench``
both use it. Its modules, lowest first:

* :mod:`.model`: what was measured (``Op``, ``Measured``), DynamoDB's partition and table
  limits, shared prices, the stacks' environments;
* :mod:`.corrections`: the measured per-worker rates corrected for a fleet of any size;
* :mod:`.fleet`: DynamoDB requests, units and $ per table and hottest partition;
* :mod:`.limits`: every limit in every scenario, the first one hit, $ per month in all;
* :mod:`.prices`: the list prices of the messages' services, with their source and date;
* :mod:`.sinks`: the messages table and the Kinesis stream priced side by side;
* :mod:`.modes`: every way to keep the messages (the table and the stream, each on-demand
  or provisioned; Firehose to S3), the environment's and the cheapest that holds;
* :mod:`.large_frames` and :mod:`.secrets`: what large frames and upstream secrets cost.
"""
