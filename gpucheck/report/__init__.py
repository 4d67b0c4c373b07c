"""Results of a run: the results.jsonl format, its JSON Schema, JUnit XML and (later) HTML."""
