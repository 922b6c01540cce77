"""``make demo``: the whole fleet on this machine through a scenario, with a report.
:mod:`.cli` reads the command line and runs it (a chaos run is :mod:`sim.chaos`'s);
:mod:`.scenarios` plays the steps on the fleet. Above the rest of :mod:`sim`, chaos
included: nothing imports it."""
