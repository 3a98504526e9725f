//go:build !race

package overlay

// raceEnabled reports whether the tests run under the race detector.
const raceEnabled = false
