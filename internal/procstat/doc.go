// Package procstat reads this process's CPU time and peak memory, for the
// figures testnets and benchmarks report.
package procstat
