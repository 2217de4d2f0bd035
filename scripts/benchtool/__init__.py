"""The benchmark tool behind scripts/bench: measure (JSON) -> render (Markdown) -> check.

Modules:
    resp       a minimal RESP client and a server launcher (standard library only)
    callgrind  a parser for callgrind output files (tested on recorded fixtures)
    spec       what is measured: workloads, profile parts, targets
    measure    runs the servers and writes the results JSON
    render     builds BENCHMARKS.md from the results JSON through template.md
    cli        the command line of scripts/bench
"""
