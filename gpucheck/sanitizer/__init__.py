"""compute-sanitizer: building the command a worker runs under, and parsing its log."""

from gpucheck.sanitizer.parser import SanitizerFinding, SanitizerReport, parse, parse_file

__all__ = ["SanitizerFinding", "SanitizerReport", "parse", "parse_file"]
