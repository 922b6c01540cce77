"""Chaos soak: seeded random faults against the whole fleet, then an audit of the
invariants from independent evidence (``make chaos``, ``python -m sim.chaos``).

Three parts kept apart, as Jepsen keeps them:

* :mod:`.schedule`, the generator: a schedule of faults drawn from one seed (the same
  seed replays the same schedule), and the recovery bound of each kind of fault;
* :mod:`.nemesis`: injects each fault into the running fleet (the emulator's fault
  switch, the upstream's controls, byzantine frames from :mod:`.byzantine`, signals to
  the worker processes and what :mod:`.workers` reads of them from outside, libfaketime,
  the API) and writes down what it did and to whom (:mod:`.history`);
* :mod:`.checker`: reads only :mod:`.evidence` (the upstream's books, the tables, the
  emulator's write journal, the observer's samples) beside that history, and names
  every violation: the stored data (:mod:`.data`), recovery times against their bounds
  (:mod:`.recovery`) and moves of ownership nothing explains (:mod:`.moves`) included;
  the workers' logs are a cross-check, never evidence.

:mod:`.run` plays a whole run on a :class:`~sim.fleet.Fleet`; :mod:`.report`
renders what it found.
"""
