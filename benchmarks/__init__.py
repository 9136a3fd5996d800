"""Side-by-side benchmarks; a package so that spawned children import these modules by a unique name."""
