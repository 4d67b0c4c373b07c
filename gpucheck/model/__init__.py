"""gpucheck's data model: what a run writes and every reader reads, below the detectors, the
worker, the controller and the report.

* :mod:`~gpucheck.model.results`: the records of ``results.jsonl`` (``Finding``,
  ``CaseRecord``; ``Status`` and ``Severity``), their schema and the one writer (``append``);
  ``CaseInfo.finding`` makes a case's finding, ``Origin.record`` a worker's case record,
  ``CaseData`` is what detectors add to it;
* a case record's payload, each with its writer (``to_json``) and tolerant reader
  (``from_json``): :mod:`~gpucheck.model.memory` (``Memory``),
  :mod:`~gpucheck.model.numerics` (``Measured``), :mod:`~gpucheck.model.group` (a group
  fault's ``GroupRecord``, and each rank's collective log: ``CollectiveEntry``, ``read_log``);
  the header's settings: :mod:`~gpucheck.model.settings` (``RunSettings``);
* :mod:`~gpucheck.model.runlog`: the one reader (``RunLog``): every record typed, read
  incrementally, a folder someone else made judged on the way in;
* :mod:`~gpucheck.model.modes`: a pass's mode label as a type (``Mode``);
* :mod:`~gpucheck.model.layout`: the run folder and the files of each worker in it;
* :mod:`~gpucheck.model.contract`: what the controller and the worker agree on beyond the
  records: environment variables, pytest options, properties, exit codes.
"""
